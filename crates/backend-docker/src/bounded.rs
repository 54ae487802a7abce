//! Bounded concurrency for the engine requests one call fans out (stats, inspects, removals).

use std::future::Future;

/// Runs the futures with at most `limit` in flight, outputs in input order.
pub(crate) async fn bounded_join<F: Future>(futures: Vec<F>, limit: usize) -> Vec<F::Output> {
    use futures_util::StreamExt as _;
    futures_util::stream::iter(futures)
        .buffered(limit.max(1))
        .collect()
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn bounded_join_keeps_order_and_the_bound() {
        let in_flight = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let futures: Vec<_> = (0..20u64)
            .map(|i| {
                let in_flight = Arc::clone(&in_flight);
                let peak = Arc::clone(&peak);
                async move {
                    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(5 * (20 - i))).await;
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    i
                }
            })
            .collect();
        assert_eq!(bounded_join(futures, 4).await, (0..20).collect::<Vec<_>>());
        // Exactly the bound in flight at the peak: four ran at once, never a fifth (a sequential
        // join would peak at one).
        assert_eq!(peak.load(Ordering::SeqCst), 4);
    }
}
