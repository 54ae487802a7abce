//! Helpers shared by the integration tests: watching the processes a child started.
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

/// True while `pid` exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // The state follows the parenthesised command name.
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next());
            !matches!(state, Some("Z") | Some("X") | None)
        }
        Err(_) => false,
    }
}

/// Waits until `pid` is gone or a zombie, up to `within`.
pub async fn wait_dead(pid: i32, within: Duration) -> bool {
    let end = tokio::time::Instant::now() + within;
    while alive(pid) {
        if tokio::time::Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

/// Reads a file of whitespace-separated pids, waiting up to 5 s until it holds `count` of them.
pub async fn read_pids(file: &Path, count: usize) -> Vec<i32> {
    let end = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let pids: Vec<i32> = text
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        if pids.len() >= count && text.ends_with('\n') {
            return pids;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "{} never held {count} pids: {text:?}",
            file.display()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
