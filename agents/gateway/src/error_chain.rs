//! An error with its causes on one line, for the logs: each cause once,
//! as anyhow's `{:#}` prints a chain.

/// `error: cause: cause's cause`.
pub fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        text.push_str(": ");
        text.push_str(&e.to_string());
        cause = e.source();
    }
    text
}
