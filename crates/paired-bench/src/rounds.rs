//! Rounds that time our side and the raw reference back to back.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

/// Times one future.
pub async fn timed<T>(work: impl Future<Output = T>) -> (T, Duration) {
    let started = Instant::now();
    let value = work.await;
    (value, started.elapsed())
}

/// Runs both sides' work of one round one after the other, ours first in even rounds and the
/// raw side first in odd ones, so neither always meets a warmer machine; both outputs, in the
/// sides' own order. For work that times itself (a batch timed inside a container).
pub async fn in_turn<A, B>(
    round: usize,
    ours: impl Future<Output = A>,
    raw: impl Future<Output = B>,
) -> (A, B) {
    if round % 2 == 0 {
        let ours = ours.await;
        (ours, raw.await)
    } else {
        let raw = raw.await;
        (ours.await, raw)
    }
}

/// Times our side's and the raw side's work of one round back to back, in the order
/// [`in_turn`] gives them; the two times as `(ours, raw)`.
pub async fn paired<A, B>(
    round: usize,
    ours: impl Future<Output = A>,
    raw: impl Future<Output = B>,
) -> (Duration, Duration) {
    let ((_, ours), (_, raw)) = in_turn(round, timed(ours), timed(raw)).await;
    (ours, raw)
}

/// Times each piece of work of one round in turn, starting with piece `round % n`, and returns
/// the times in the pieces' own order.
pub async fn round_robin(
    round: usize,
    mut work: Vec<Pin<Box<dyn Future<Output = ()> + '_>>>,
) -> Vec<Duration> {
    let n = work.len();
    let mut times = vec![Duration::ZERO; n];
    for step in 0..n {
        let index = (round + step) % n;
        let ((), took) = timed(work[index].as_mut()).await;
        times[index] = took;
    }
    times
}

/// Runs `warmup` rounds and then `rounds` more, each `round(index)` with the index counting from
/// 0 over both; what the measured rounds returned, the warm-up's discarded.
pub async fn measured<T, F, Fut>(warmup: usize, rounds: usize, mut round: F) -> Vec<T>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = T>,
{
    let mut kept = Vec::with_capacity(rounds);
    for index in 0..warmup + rounds {
        let value = round(index).await;
        if index >= warmup {
            kept.push(value);
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// Polls a future that never waits to its end.
    fn ready<T>(work: impl Future<Output = T>) -> T {
        let mut work = std::pin::pin!(work);
        let mut context = std::task::Context::from_waker(std::task::Waker::noop());
        match work.as_mut().poll(&mut context) {
            std::task::Poll::Ready(value) => value,
            std::task::Poll::Pending => panic!("the work waited"),
        }
    }

    #[test]
    fn the_sides_alternate_which_goes_first() {
        let order = RefCell::new(Vec::new());
        for round in 0..4 {
            let (a, b) = ready(in_turn(
                round,
                async { order.borrow_mut().push("ours") },
                async { order.borrow_mut().push("raw") },
            ));
            let ((), ()) = (a, b);
        }
        assert_eq!(
            order.into_inner(),
            ["ours", "raw", "raw", "ours", "ours", "raw", "raw", "ours"]
        );
    }

    #[test]
    fn round_robin_starts_one_piece_later_each_round_and_keeps_the_pieces_order() {
        let order = RefCell::new(Vec::new());
        let times = ready(round_robin(
            1,
            (0..3)
                .map(|piece| {
                    let order = &order;
                    Box::pin(async move { order.borrow_mut().push(piece) })
                        as Pin<Box<dyn Future<Output = ()>>>
                })
                .collect(),
        ));
        assert_eq!(order.into_inner(), [1, 2, 0]);
        assert_eq!(times.len(), 3);
    }

    #[test]
    fn the_warm_up_rounds_run_but_are_not_kept() {
        let ran = RefCell::new(Vec::new());
        let kept = ready(measured(2, 3, |index| {
            ran.borrow_mut().push(index);
            async move { index * 10 }
        }));
        assert_eq!(ran.into_inner(), [0, 1, 2, 3, 4]);
        assert_eq!(kept, [20, 30, 40]);
    }
}
