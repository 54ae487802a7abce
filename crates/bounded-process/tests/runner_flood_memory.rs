//! A command printing without end on both pipes is refused with the output-limit error, and the
//! runner's memory grows by at most 2 × the budget + 8 MiB. Alone in its binary, so no other test
//! moves this process's peak RSS.

use std::time::{Duration, Instant};

use bounded_process::{BoundedCommand, Error, DEFAULT_OUTPUT_BUDGET};

fn status_kib(field: &str) -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|line| line.starts_with(field))
        .unwrap_or_else(|| panic!("{field} missing from /proc/self/status"));
    line[field.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn a_gibibyte_flood_is_refused_within_the_memory_bound() {
    // Warm up: the first spawn sets up the runtime's signal and process machinery.
    BoundedCommand::new("/bin/true", Duration::from_secs(5))
        .run()
        .await
        .unwrap();
    // Reset the peak to the current RSS where the kernel allows it; the comparison below is
    // against the RSS before the run either way, which only makes it stricter.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let before = status_kib("VmRSS:");

    let started = Instant::now();
    let result = BoundedCommand::new("/bin/sh", Duration::from_secs(60))
        .args([
            "-c",
            "head -c 1073741824 /dev/zero & head -c 1073741824 /dev/zero >&2; wait",
        ])
        .env("PATH", "/usr/bin:/bin")
        .run()
        .await;
    let elapsed = started.elapsed();
    let peak = status_kib("VmHWM:");

    match result {
        Err(Error::OutputLimit { budget, .. }) => assert_eq!(budget, DEFAULT_OUTPUT_BUDGET),
        other => panic!("a flood must be refused with the output limit: {other:?}"),
    }
    assert!(
        elapsed < Duration::from_secs(30),
        "refusal took {elapsed:?}"
    );
    let growth_kib = peak.saturating_sub(before);
    let bound_kib = (2 * DEFAULT_OUTPUT_BUDGET + 8 * 1024 * 1024) / 1024;
    eprintln!(
        "RSS before {before} KiB, peak {peak} KiB, growth {growth_kib} KiB, bound {bound_kib} KiB"
    );
    assert!(
        growth_kib <= bound_kib,
        "runner grew by {growth_kib} KiB, above 2 × budget + 8 MiB = {bound_kib} KiB"
    );
}
