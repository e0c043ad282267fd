//! What the agent's allocator holds, logged on SIGUSR1: the heap the
//! program uses (allocated), the pages that hold it (active), what of
//! jemalloc's is resident, and what it keeps mapped or has given back to
//! the system but kept the addresses of (retained). The process's
//! resident size is these pages plus its code and stacks; the difference
//! says whether memory is the program's or the allocator's.

use tikv_jemalloc_ctl::{epoch, stats};

/// The allocator's figures, in bytes.
#[derive(Debug, Clone, Copy)]
struct Figures {
    allocated: usize,
    active: usize,
    resident: usize,
    mapped: usize,
    retained: usize,
}

fn read() -> Result<Figures, tikv_jemalloc_ctl::Error> {
    // The statistics are a snapshot taken at each epoch.
    epoch::advance()?;
    Ok(Figures {
        allocated: stats::allocated::read()?,
        active: stats::active::read()?,
        resident: stats::resident::read()?,
        mapped: stats::mapped::read()?,
        retained: stats::retained::read()?,
    })
}

/// Logs the allocator's figures on every SIGUSR1; never ends.
pub async fn report_on_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut signals = match signal(SignalKind::user_defined1()) {
        Ok(s) => s,
        Err(error) => {
            tracing::warn!(%error, "cannot listen for SIGUSR1: no memory report");
            return std::future::pending().await;
        }
    };
    while signals.recv().await.is_some() {
        match read() {
            Ok(f) => {
                let mib = |b: usize| format!("{:.1}", b as f64 / 1_048_576.0);
                tracing::info!(
                    allocated_mib = %mib(f.allocated),
                    active_mib = %mib(f.active),
                    resident_mib = %mib(f.resident),
                    mapped_mib = %mib(f.mapped),
                    retained_mib = %mib(f.retained),
                    "memory"
                );
            }
            Err(error) => tracing::warn!(%error, "cannot read the allocator's statistics"),
        }
    }
    std::future::pending().await
}
