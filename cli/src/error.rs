//! How failures reach the user: one line that says what is wrong and what to
//! do, and an exit code that tells scripts which kind of failure it was.

use std::process::ExitCode;

/// A failure the user can act on. Anything else is unexpected and exits 1.
#[derive(Debug, thiserror::Error)]
pub enum UserError {
    /// A flag's value makes no sense.
    #[error("{0}")]
    Usage(String),
    /// The kubeconfig cannot be read, or lacks what was asked of it.
    #[error("{0}")]
    Config(String),
    /// The cluster did not accept the credentials (401); exits as a
    /// kubeconfig problem does.
    #[error("{0}")]
    Unauthenticated(String),
    /// The cluster did not answer.
    #[error("{0}")]
    Unreachable(String),
    /// The cluster answered, but refused: missing permissions.
    #[error("{0}")]
    Forbidden(String),
    /// The command cannot run in the cluster's current state.
    #[error("{0}")]
    Refused(String),
    /// A named thing does not exist.
    #[error("{0}")]
    NotFound(String),
    /// Waited too long.
    #[error("{0}")]
    Timeout(String),
    /// A check ran and found something broken (`liqoctl test`).
    #[error("{0}")]
    CheckFailed(String),
}

/// Exit codes, documented in docs/cli.md. Clap exits 2 on bad usage itself.
pub mod exit {
    pub const UNEXPECTED: u8 = 1;
    /// Also what clap exits with on an unknown flag.
    pub const USAGE: u8 = 2;
    pub const CONFIG: u8 = 3;
    pub const UNREACHABLE: u8 = 4;
    pub const FORBIDDEN: u8 = 5;
    pub const REFUSED: u8 = 6;
    pub const NOT_FOUND: u8 = 7;
    pub const TIMEOUT: u8 = 8;
    pub const CHECK_FAILED: u8 = 9;
}

impl UserError {
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(match self {
            Self::Usage(_) => exit::USAGE,
            Self::Config(_) | Self::Unauthenticated(_) => exit::CONFIG,
            Self::Unreachable(_) => exit::UNREACHABLE,
            Self::Forbidden(_) => exit::FORBIDDEN,
            Self::Refused(_) => exit::REFUSED,
            Self::NotFound(_) => exit::NOT_FOUND,
            Self::Timeout(_) => exit::TIMEOUT,
            Self::CheckFailed(_) => exit::CHECK_FAILED,
        })
    }
}

/// Prints an error and picks the exit code: a [`UserError`] anywhere in the
/// chain is printed alone, as one line; anything else with its causes.
pub fn report(err: &anyhow::Error) -> ExitCode {
    if let Some(user) = err.chain().find_map(|e| e.downcast_ref::<UserError>()) {
        eprintln!("error: {user}");
        return user.exit_code();
    }
    eprintln!("error: {err:#}");
    ExitCode::from(exit::UNEXPECTED)
}
