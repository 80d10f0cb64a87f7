//! Ctrl-C handling with a real SIGINT sent to this test process (its own binary, one test, so
//! nothing else shares the handler).

use rlft_train::shutdown::ShutdownFlag;

#[test]
fn first_sigint_sets_the_flag_instead_of_killing_the_process() {
    let flag = ShutdownFlag::install().expect("install the handler");
    assert!(!flag.is_requested());
    let again = ShutdownFlag::install().unwrap();
    #[cfg(unix)]
    {
        signal_hook::low_level::raise(signal_hook::consts::SIGINT).unwrap();
        // Delivery to the raising thread is synchronous; allow for another thread taking it.
        for _ in 0..100 {
            if flag.is_requested() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(flag.is_requested(), "SIGINT did not set the flag");
        assert!(
            again.is_requested(),
            "install() returns the same process-wide flag"
        );
    }
    #[cfg(not(unix))]
    {
        again.request();
        assert!(flag.is_requested());
    }
    // A second SIGINT would now exit with status 130; not sent here.
}
