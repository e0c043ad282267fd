//! Where output goes. Results go to stdout; progress and notes go to stderr,
//! as spinners on a terminal and as plain lines otherwise, and not at all
//! with `--quiet`. Commands never print directly.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::cli::OutputFormat;

#[derive(Debug, Clone, Copy)]
pub struct Printer {
    quiet: bool,
    /// Spinners and prompts only make sense when a person watches stderr.
    interactive: bool,
    /// Each finished step says how long it took (`-v`).
    timed: bool,
}

impl Printer {
    pub fn new(quiet: bool) -> Self {
        Self {
            quiet,
            interactive: std::io::stderr().is_terminal(),
            timed: false,
        }
    }

    /// The same, each finished step saying how long it took, and the
    /// command its total ([`Self::total`]).
    pub fn timed(self, timed: bool) -> Self {
        Self { timed, ..self }
    }

    /// With `-v`, the time since `started`, the start of the command, as
    /// its last line on stderr (`done in 1.84 s`).
    pub fn total(&self, what: &str, started: Instant) {
        if self.timed && !self.quiet {
            eprintln!("{what} in {}", seconds(started.elapsed()));
        }
    }

    /// A line of progress or information, on stderr.
    pub fn info(&self, message: impl AsRef<str>) {
        if !self.quiet {
            eprintln!("{}", message.as_ref());
        }
    }

    /// The command's result, on stdout.
    pub fn result(&self, text: impl AsRef<str>) {
        write_stdout(format!("{}\n", text.as_ref()).as_bytes());
    }

    /// A value in the requested machine-readable format, on stdout.
    pub fn structured<T: Serialize>(&self, value: &T, format: OutputFormat) -> anyhow::Result<()> {
        let text = match format {
            OutputFormat::Json => serde_json::to_string_pretty(value)?,
            OutputFormat::Yaml => serde_yaml::to_string(value)?,
        };
        self.result(text.trim_end());
        Ok(())
    }

    /// Asks a yes/no question on a terminal; elsewhere, or with `--yes`,
    /// the answer is yes, as scripts cannot answer.
    pub fn confirm(&self, question: &str, yes: bool) -> anyhow::Result<bool> {
        if yes || !self.interactive || !std::io::stdin().is_terminal() {
            return Ok(true);
        }
        Ok(dialoguer::Confirm::new()
            .with_prompt(question)
            .default(false)
            .interact()?)
    }

    /// Starts a step: a spinner on a terminal, a plain line otherwise.
    pub fn step(&self, message: impl Into<String>) -> Step {
        let message = message.into();
        let bar = if self.quiet {
            None
        } else if self.interactive {
            let bar = ProgressBar::new_spinner();
            bar.set_style(
                ProgressStyle::with_template("{spinner} {msg} {elapsed:.dim}")
                    .expect("invariant: the template is valid"),
            );
            bar.set_message(message.clone());
            bar.enable_steady_tick(Duration::from_millis(100));
            Some(bar)
        } else {
            eprintln!("{message}...");
            None
        };
        Step {
            bar,
            message,
            quiet: self.quiet,
            started: self.timed.then(Instant::now),
        }
    }
}

/// A duration as a person reads it: `0.42 s`, `12.3 s`.
fn seconds(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 10.0 {
        format!("{s:.2} s")
    } else {
        format!("{s:.1} s")
    }
}

/// Writes to stdout. When the reader has gone (`liqoctl info | head -1`),
/// there is nobody left to tell anything: exit quietly, as tools killed by
/// SIGPIPE do, instead of panicking as `println!` would.
pub fn write_stdout(bytes: &[u8]) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(bytes).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: writing to stdout: {e}");
        std::process::exit(i32::from(crate::error::exit::UNEXPECTED));
    }
}

/// A step in progress; say how it ended with [`Step::done`] or
/// [`Step::fail`]. Dropped unfinished, it clears its spinner.
#[derive(Debug)]
pub struct Step {
    bar: Option<ProgressBar>,
    message: String,
    quiet: bool,
    /// When it started, if it is to say how long it took.
    started: Option<Instant>,
}

impl Step {
    pub fn done(self, outcome: impl AsRef<str>) {
        self.finish("✔", outcome.as_ref());
    }

    pub fn fail(self, outcome: impl AsRef<str>) {
        self.finish("✘", outcome.as_ref());
    }

    /// Ends the step as `result` says (done, or failed), and hands the
    /// result on.
    pub fn ended<T>(self, result: anyhow::Result<T>) -> anyhow::Result<T> {
        self.ended_saying(result, |_| String::new())
    }

    /// [`Self::ended`], done with what `said` makes of the result.
    pub fn ended_saying<T>(
        self,
        result: anyhow::Result<T>,
        said: impl FnOnce(&T) -> String,
    ) -> anyhow::Result<T> {
        match &result {
            Ok(t) => self.done(said(t)),
            Err(_) => self.fail(""),
        }
        result
    }

    fn finish(mut self, mark: &str, outcome: &str) {
        let mut line = if outcome.is_empty() {
            format!("{mark} {}", self.message)
        } else {
            format!("{mark} {}: {outcome}", self.message)
        };
        if let Some(started) = self.started {
            line.push_str(&format!(" ({})", seconds(started.elapsed())));
        }
        match self.bar.take() {
            Some(bar) => {
                bar.set_style(
                    ProgressStyle::with_template("{msg}").expect("invariant: valid template"),
                );
                bar.finish_with_message(line);
            }
            None if !self.quiet => eprintln!("{line}"),
            None => {}
        }
    }
}

impl Drop for Step {
    fn drop(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}
