//! Clean stop on Ctrl-C: the first SIGINT (or SIGTERM) sets a flag that the trainer polls
//! between steps to save a checkpoint and exit; a second one exits at once (status 130), for when
//! the save itself hangs.
//!
//! ```no_run
//! let stop = rlft_train::shutdown::ShutdownFlag::install().expect("signal handlers");
//! for step in 1..=100 {
//!     // ... one training step ...
//!     if stop.is_requested() {
//!         // save a checkpoint, then
//!         break;
//!     }
//! }
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Exit status after a second Ctrl-C (128 + SIGINT, as shells report it).
pub const FORCED_EXIT_STATUS: i32 = 130;

/// Installing the signal handlers failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot install the Ctrl-C handler: {0}; run without it (Ctrl-C will then stop the run without saving)")]
pub struct ShutdownError(#[from] std::io::Error);

/// A shared "please stop" flag. Clones share the flag.
#[derive(Debug, Clone, Default)]
pub struct ShutdownFlag(Arc<AtomicBool>);

static INSTALLED: Mutex<Option<ShutdownFlag>> = Mutex::new(None);

impl ShutdownFlag {
    /// A flag no signal sets (for tests, or stopping for other reasons: a time limit, a target
    /// metric).
    pub fn new() -> Self {
        Self::default()
    }

    /// The process-wide flag, set by SIGINT and SIGTERM; the handlers are installed on the first
    /// call, later calls return the same flag. Once set, another SIGINT/SIGTERM exits the
    /// process with [`FORCED_EXIT_STATUS`].
    pub fn install() -> Result<Self, ShutdownError> {
        let mut installed = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(flag) = &*installed {
            return Ok(flag.clone());
        }
        let flag = ShutdownFlag::new();
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            // Order matters: the exit check runs before the flag is set, so the first signal
            // only sets it and the second finds it set.
            signal_hook::flag::register_conditional_shutdown(
                sig,
                FORCED_EXIT_STATUS,
                Arc::clone(&flag.0),
            )?;
            signal_hook::flag::register(sig, Arc::clone(&flag.0))?;
        }
        *installed = Some(flag.clone());
        Ok(flag)
    }

    /// Asks for a stop (what the signal handler does).
    pub fn request(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether a stop was asked for.
    pub fn is_requested(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_the_flag() {
        let a = ShutdownFlag::new();
        let b = a.clone();
        assert!(!b.is_requested());
        a.request();
        assert!(b.is_requested());
        assert!(!ShutdownFlag::new().is_requested());
        let t = std::thread::spawn(move || b.is_requested());
        assert!(t.join().unwrap());
    }
}
