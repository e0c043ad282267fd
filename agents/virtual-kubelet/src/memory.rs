//! What the agent's allocator holds, logged on SIGUSR1: the heap the
//! program uses (allocated), the pages that hold it (active), what of
//! jemalloc's is resident, and what it keeps mapped or has given back to
//! the system but kept the addresses of (retained). The process's
//! resident size is these pages plus its code and stacks; the difference
//! says whether memory is the program's or the allocator's.
//!
//! When jemalloc profiles the heap (the `heap-profile` feature and
//! `prof:true` in its options), each SIGUSR1 also dumps a heap profile
//! where its `prof_prefix` says, for `jeprof`.

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
        if profiling() {
            dump_profile();
        }
    }
    std::future::pending().await
}

/// Whether jemalloc profiles the heap: built with profiling and started
/// with `prof:true`.
#[allow(unsafe_code)] // jemalloc's own interface; see below.
fn profiling() -> bool {
    // SAFETY: `opt.prof` is a bool, present whether or not profiling is
    // built in (false without it).
    unsafe { tikv_jemalloc_ctl::raw::read::<bool>(b"opt.prof\0") }.unwrap_or(false)
}

/// Dumps a heap profile, named by jemalloc from its `prof_prefix`.
#[allow(unsafe_code)] // jemalloc's own interface; see below.
fn dump_profile() {
    // SAFETY: `prof.dump` takes a `const char *` file name, or null for
    // one of jemalloc's own; a null pointer is of the type it reads.
    let dumped = unsafe {
        tikv_jemalloc_ctl::raw::write(b"prof.dump\0", std::ptr::null::<std::ffi::c_char>())
    };
    match dumped {
        Ok(()) => tracing::info!("heap profile dumped"),
        Err(error) => tracing::warn!(%error, "cannot dump a heap profile"),
    }
}
