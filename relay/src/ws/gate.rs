//! A stream polled only once it has said it may have something: the
//! connection's socket, read through tungstenite.
//!
//! Why: the connection task wakes for each live event, and its loop then
//! polls every branch that is not ready, the socket too. A poll of the
//! socket through tungstenite zeroes the read buffer (`read_buffer_size`,
//! 4 KiB) and takes the split halves' lock before it finds nothing to
//! read: 8.6 % of the relay's CPU in fan-out to 1,000 subscribers (perf,
//! docs/performance.md). Behind the gate the socket is polled with a
//! waker of the gate's own, and again only after that waker fired (or
//! after a poll that gave an item: more may be buffered).
//!
//! No wake-up is lost: the task's waker is registered before the flag is
//! read, and the inner stream's waker sets the flag before it wakes the
//! task (the pattern of `futures`' `FuturesUnordered`). A poll that the
//! inner stream declines for tokio's cooperative budget wakes its waker,
//! so it too opens the gate.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;
use futures_util::Stream;

/// Whether the inner stream woke since it was last polled, and the task
/// to wake when it does.
struct Flag {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

/// `inner`, polled only when its own waker fired since its last `Pending`.
pub struct Gated<S> {
    inner: S,
    flag: Arc<Flag>,
    /// The inner stream's waker (made once: a `Waker` of `flag`).
    waker: Waker,
}

impl<S> Gated<S> {
    pub fn new(inner: S) -> Self {
        let flag = Arc::new(Flag {
            // Open: the first poll reaches the inner stream.
            woken: AtomicBool::new(true),
            task: AtomicWaker::new(),
        });
        let waker = Waker::from(flag.clone());
        Gated { inner, flag, waker }
    }
}

impl<S: Stream + Unpin> Stream for Gated<S> {
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let this = &mut *self;
        this.flag.task.register(cx.waker());
        if !this.flag.woken.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        let mut own = Context::from_waker(&this.waker);
        let polled = Pin::new(&mut this.inner).poll_next(&mut own);
        if polled.is_ready() {
            // An item (or the end): the next poll asks again.
            this.flag.woken.store(true, Ordering::Release);
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::Gated;
    use futures_util::StreamExt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Poll;

    /// A stream that counts its polls and yields what a channel has.
    struct Counted {
        rx: tokio::sync::mpsc::UnboundedReceiver<u32>,
        polls: Arc<AtomicUsize>,
    }

    impl futures_util::Stream for Counted {
        type Item = u32;
        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> Poll<Option<u32>> {
            self.polls.fetch_add(1, Ordering::Relaxed);
            self.rx.poll_recv(cx)
        }
    }

    /// Polls without a send between them reach the inner stream once; a
    /// send opens the gate and the item comes through; items already
    /// there come one poll each.
    #[tokio::test]
    async fn polls_the_inner_stream_only_after_it_woke() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let polls = Arc::new(AtomicUsize::new(0));
        let mut gated = Gated::new(Counted {
            rx,
            polls: polls.clone(),
        });
        for _ in 0..5 {
            let got = futures_util::poll!(gated.next());
            assert!(got.is_pending());
        }
        assert_eq!(polls.load(Ordering::Relaxed), 1, "closed after the first Pending");
        let waiting = tokio::spawn(async move {
            let first = gated.next().await;
            let second = gated.next().await;
            (first, second, gated)
        });
        tx.send(7).unwrap();
        tx.send(8).unwrap();
        let (first, second, mut gated) = waiting.await.unwrap();
        assert_eq!((first, second), (Some(7), Some(8)));
        drop(tx);
        assert_eq!(gated.next().await, None, "the end comes through");
    }
}
