//! Free TCP ports on loopback, never the same one twice in a process.

use std::collections::HashSet;
use std::net::TcpListener;
use std::sync::Mutex;

static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// A loopback port that was free a moment ago and that this process has not
/// handed out before. Another process may still take it first; callers treat
/// a failed bind as a failed start and retry.
pub(crate) fn free_port() -> std::io::Result<u16> {
    let mut handed = HANDED_OUT.lock().unwrap_or_else(|p| p.into_inner());
    let handed = handed.get_or_insert_with(HashSet::new);
    for _ in 0..64 {
        let port = TcpListener::bind(("127.0.0.1", 0))?.local_addr()?.port();
        if handed.insert(port) {
            return Ok(port);
        }
    }
    Err(std::io::Error::other("no free loopback port found"))
}
