//! The outbound side of one WebSocket: a queue bounded in bytes, drained by
//! its own writer task so that a slow socket never blocks the reader.
//!
//! Live events are pushed without waiting: if the queue would exceed
//! `max_outbound_bytes` the connection is a slow reader and is dropped (it
//! must never stall other connections or grow memory without bound). Stored
//! query results may instead wait, up to a deadline, for the queue to drain.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use futures_util::stream::SplitSink;
use futures_util::SinkExt;
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

/// Frames written before one flush, at most.
const MAX_FRAMES_PER_FLUSH: usize = 64;

/// The queue would exceed its byte bound (or the writer is gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overflow;

struct Shared {
    queued_bytes: AtomicUsize,
    drained: Notify,
    failed: AtomicBool,
    failed_notify: Notify,
}

/// Handle used by the connection task to queue messages.
pub struct Outbound {
    tx: mpsc::UnboundedSender<Message>,
    shared: Arc<Shared>,
    max_bytes: usize,
}

/// Starts the writer task for `sink`.
pub fn spawn(mut sink: SplitSink<WebSocket, Message>, max_bytes: usize) -> (Outbound, JoinHandle<()>) {
    assert!(max_bytes > 0);
    let (tx, mut rx) = mpsc::unbounded_channel::<Message>();
    let shared = Arc::new(Shared {
        queued_bytes: AtomicUsize::new(0),
        drained: Notify::new(),
        failed: AtomicBool::new(false),
        failed_notify: Notify::new(),
    });
    let writer_shared = shared.clone();
    let writer = tokio::spawn(async move {
        // Whatever is queued goes out with one flush (one write to the
        // socket for a query's results or a burst of OKs), at most
        // `MAX_FRAMES_PER_FLUSH` frames at a time.
        while let Some(first) = rx.recv().await {
            let mut next = Some(first);
            let (mut bytes, mut frames, mut closing) = (0usize, 0usize, false);
            let mut fed = Ok(());
            while let Some(msg) = next.take() {
                bytes += message_len(&msg);
                frames += 1;
                closing = matches!(msg, Message::Close(_));
                fed = sink.feed(msg).await;
                if fed.is_err() || closing || frames >= MAX_FRAMES_PER_FLUSH {
                    break;
                }
                next = rx.try_recv().ok();
            }
            let sent = match fed {
                Ok(()) => sink.flush().await,
                Err(e) => Err(e),
            };
            writer_shared.queued_bytes.fetch_sub(bytes, Ordering::SeqCst);
            writer_shared.drained.notify_waiters();
            if sent.is_err() || closing {
                break;
            }
        }
        let _ = sink.close().await;
        writer_shared.failed.store(true, Ordering::SeqCst);
        writer_shared.failed_notify.notify_waiters();
    });
    (
        Outbound {
            tx,
            shared,
            max_bytes,
        },
        writer,
    )
}

fn message_len(m: &Message) -> usize {
    match m {
        Message::Text(t) => t.len(),
        Message::Binary(b) => b.len(),
        _ => 16,
    }
}

impl Outbound {
    /// Queues a text message; fails when the byte bound would be exceeded.
    pub fn text(&self, s: String) -> Result<(), Overflow> {
        let len = s.len();
        let before = self.shared.queued_bytes.fetch_add(len, Ordering::SeqCst);
        if before + len > self.max_bytes || self.shared.failed.load(Ordering::SeqCst) {
            self.shared.queued_bytes.fetch_sub(len, Ordering::SeqCst);
            return Err(Overflow);
        }
        self.tx.send(Message::Text(s.into())).map_err(|_| Overflow)
    }

    /// Queues a text message, first waiting up to `deadline` for room.
    pub async fn text_wait(&self, s: String, deadline: Duration) -> Result<(), Overflow> {
        let len = s.len().min(self.max_bytes);
        let wait = async {
            loop {
                let drained = self.shared.drained.notified();
                if self.shared.failed.load(Ordering::SeqCst) {
                    return Err(Overflow);
                }
                if self.shared.queued_bytes.load(Ordering::SeqCst) + len <= self.max_bytes {
                    return Ok(());
                }
                drained.await;
            }
        };
        tokio::time::timeout(deadline, wait)
            .await
            .map_err(|_| Overflow)??;
        if s.len() > self.max_bytes {
            // A single message larger than the whole bound still goes out
            // once the queue is empty; the bound is on what waits, not on one event.
            self.shared.queued_bytes.fetch_add(s.len(), Ordering::SeqCst);
            return self.tx.send(Message::Text(s.into())).map_err(|_| Overflow);
        }
        self.text(s)
    }

    /// Queues a close frame; the writer stops after sending it.
    pub fn close(&self, code: u16, reason: &str) {
        let frame = CloseFrame {
            code,
            reason: reason.to_string().into(),
        };
        let _ = self.tx.send(Message::Close(Some(frame)));
    }

    /// Resolves when the writer has stopped (socket error or close sent).
    pub async fn failed(&self) {
        loop {
            let n = self.shared.failed_notify.notified();
            if self.shared.failed.load(Ordering::SeqCst) {
                return;
            }
            n.await;
        }
    }
}
