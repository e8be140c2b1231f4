//! The outbound side of one WebSocket: a queue bounded in bytes, drained by
//! its own writer task so that a slow socket never blocks the reader, and
//! the relay-wide [`Budget`] that all the queues share.
//!
//! Two bounds hold what a reader that does not read can cost:
//! - per connection, `max_outbound_bytes` of frames (counted whole);
//! - relay-wide, `max_outbound_bytes_total` of what the queues own: a
//!   private frame (stored results, OK, NOTICE) whole, a live event's JSON
//!   once however many queues hold it (each queue holds the event by
//!   reference and its own `["EVENT","<sub>",` prefix; the frame is put
//!   together only as it is written). Before, each of 100 subscribers that
//!   never read held its own copy: +665 MiB for 8 MB published.
//!
//! Live events and answers are pushed without waiting: past the
//! connection's bound the connection is a slow reader and is dropped, and
//! past the relay-wide bound so is any connection that is behind (more than
//! [`KEEPING_UP_BYTES`] queued); one that keeps up is never refused for
//! others' backlog. Stored query results instead wait, up to a deadline,
//! for room in both (see [`Outbound::wait_room`]).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use futures_util::stream::SplitSink;
use futures_util::SinkExt;
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

pub use crate::budget::Budget;
use crate::hub::Published;

/// A connection with less than this queued is keeping up with its
/// stream: the relay-wide output budget never disconnects it.
pub const KEEPING_UP_BYTES: usize = 64 * 1024;

/// Frames written before one flush, at most.
const MAX_FRAMES_PER_FLUSH: usize = 64;
/// Bytes written before one flush, at most (past the first frame): what
/// the socket's write buffer holds beyond the queue while a flush waits.
const MAX_BYTES_PER_FLUSH: usize = 64 * 1024;

/// The queue would exceed its byte bound (or the writer is gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overflow;

/// One queued frame. The queue holds each boxed: tokio's unbounded
/// channel allocates its first block of 32 slots with the channel, for
/// every connection (an idle one too), and a slot is a pointer (8 bytes)
/// rather than a frame (48): about 1.3 KB less a connection.
enum Frame {
    /// Owned text, charged whole to the connection and to the budget.
    Text(String),
    /// A live event: `prefix` (`["EVENT","<sub>",`), the event's JSON
    /// (shared, charged to the budget once by [`Published`]) and `]`.
    Live {
        prefix: String,
        event: Arc<Published>,
    },
    Close(CloseFrame),
}

impl Frame {
    /// Bytes this frame counts against its connection's bound.
    fn len(&self) -> usize {
        match self {
            Frame::Text(t) => t.len(),
            Frame::Live { prefix, event } => prefix.len() + event.raw.len() + 1,
            Frame::Close(_) => 0,
        }
    }

    /// Bytes this frame's queue owns (what the relay-wide budget counts).
    fn owned(&self) -> usize {
        match self {
            Frame::Text(t) => t.len(),
            Frame::Live { prefix, .. } => prefix.len(),
            Frame::Close(_) => 0,
        }
    }

    fn into_message(self) -> Message {
        match self {
            Frame::Text(t) => Message::Text(t.into()),
            Frame::Live { prefix, event } => {
                let mut t = String::with_capacity(prefix.len() + event.raw.len() + 1);
                t.push_str(&prefix);
                t.push_str(&event.raw);
                t.push(']');
                Message::Text(t.into())
            }
            Frame::Close(c) => Message::Close(Some(c)),
        }
    }
}

struct Shared {
    queued_bytes: AtomicUsize,
    drained: Notify,
    failed: AtomicBool,
    failed_notify: Notify,
    budget: Arc<Budget>,
}

/// Handle used by the connection task to queue messages.
pub struct Outbound {
    tx: mpsc::UnboundedSender<Box<Frame>>,
    shared: Arc<Shared>,
    max_bytes: usize,
}

/// Starts the writer task for `sink`.
pub fn spawn(
    sink: SplitSink<WebSocket, Message>,
    max_bytes: usize,
    budget: Arc<Budget>,
) -> (Outbound, JoinHandle<()>) {
    assert!(max_bytes > 0);
    let (tx, rx) = mpsc::unbounded_channel::<Box<Frame>>();
    let shared = Arc::new(Shared {
        queued_bytes: AtomicUsize::new(0),
        drained: Notify::new(),
        failed: AtomicBool::new(false),
        failed_notify: Notify::new(),
        budget,
    });
    let writer = tokio::spawn(write_all(sink, rx, shared.clone()));
    (
        Outbound {
            tx,
            shared,
            max_bytes,
        },
        writer,
    )
}

/// The writer's end of the queue. Dropping it (the writer stopped, or was
/// aborted to drop a slow reader) gives back what was never written.
struct Queue {
    rx: mpsc::UnboundedReceiver<Box<Frame>>,
    shared: Arc<Shared>,
}

impl Queue {
    /// The next frame; its share of the relay-wide budget is released as
    /// it leaves the queue (past here it is the socket's write buffer,
    /// bounded by `MAX_BYTES_PER_FLUSH`), so an aborted writer leaks none.
    fn took(&self, frame: Option<Frame>) -> Option<Frame> {
        if let Some(f) = &frame {
            self.shared.budget.release(f.owned());
        }
        frame
    }

    async fn recv(&mut self) -> Option<Frame> {
        let f = self.rx.recv().await;
        self.took(f.map(|f| *f))
    }

    fn try_recv(&mut self) -> Option<Frame> {
        let f = self.rx.try_recv().ok();
        self.took(f.map(|f| *f))
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        self.rx.close();
        while let Ok(frame) = self.rx.try_recv() {
            self.shared.queued_bytes.fetch_sub(frame.len(), Ordering::SeqCst);
            self.shared.budget.release(frame.owned());
        }
    }
}

/// The writer task: whatever is queued goes out with one flush (one write
/// to the socket for a query's page or a burst of OKs), at most
/// `MAX_FRAMES_PER_FLUSH` frames and about `MAX_BYTES_PER_FLUSH` bytes at
/// a time; what a flush wrote is then released from the connection's bound.
async fn write_all(
    mut sink: SplitSink<WebSocket, Message>,
    rx: mpsc::UnboundedReceiver<Box<Frame>>,
    shared: Arc<Shared>,
) {
    let mut queue = Queue {
        rx,
        shared: shared.clone(),
    };
    while let Some(first) = queue.recv().await {
        let mut next = Some(first);
        let (mut bytes, mut frames, mut closing) = (0usize, 0usize, false);
        let mut fed = Ok(());
        while let Some(frame) = next.take() {
            bytes += frame.len();
            frames += 1;
            closing = matches!(frame, Frame::Close(_));
            fed = sink.feed(frame.into_message()).await;
            if fed.is_err() || closing || frames >= MAX_FRAMES_PER_FLUSH || bytes >= MAX_BYTES_PER_FLUSH {
                break;
            }
            next = queue.try_recv();
        }
        let sent = match fed {
            Ok(()) => sink.flush().await,
            Err(e) => Err(e),
        };
        shared.queued_bytes.fetch_sub(bytes, Ordering::SeqCst);
        shared.drained.notify_waiters();
        if sent.is_err() || closing {
            break;
        }
    }
    let _ = sink.close().await;
    shared.failed.store(true, Ordering::SeqCst);
    shared.failed_notify.notify_waiters();
}

impl Outbound {
    fn queued(&self) -> usize {
        self.shared.queued_bytes.load(Ordering::SeqCst)
    }

    /// Queues `frame` unless it would take the connection past its bound,
    /// or the relay past its budget while this connection is behind.
    fn push(&self, frame: Frame) -> Result<(), Overflow> {
        let (len, owned) = (frame.len(), frame.owned());
        let before = self.shared.queued_bytes.fetch_add(len, Ordering::SeqCst);
        let budget = &self.shared.budget;
        let over_relay = budget.used() + owned > budget.limit && before > KEEPING_UP_BYTES;
        if before + len > self.max_bytes || over_relay || self.shared.failed.load(Ordering::SeqCst) {
            self.shared.queued_bytes.fetch_sub(len, Ordering::SeqCst);
            return Err(Overflow);
        }
        budget.charge(owned);
        self.send(frame, len, owned)
    }

    /// Hands a counted frame to the writer (or gives its bytes back).
    fn send(&self, frame: Frame, len: usize, owned: usize) -> Result<(), Overflow> {
        self.tx
            .send(Box::new(frame))
            .map_err(|mpsc::error::SendError(_)| {
                self.shared.queued_bytes.fetch_sub(len, Ordering::SeqCst);
                self.shared.budget.release(owned);
                Overflow
            })
    }

    /// Queues a text message (an answer); fails past the bounds.
    pub fn text(&self, s: String) -> Result<(), Overflow> {
        self.push(Frame::Text(s))
    }

    /// Queues a live event for subscription `prefix` (`["EVENT","<sub>",`).
    pub fn live(&self, prefix: String, event: Arc<Published>) -> Result<(), Overflow> {
        self.push(Frame::Live { prefix, event })
    }

    /// Waits up to `deadline` until both the connection's queue and the
    /// relay-wide budget have room for `want` bytes, or the connection's
    /// queue is empty: a reader that keeps up is never held back by
    /// others' backlog (it then gets at least one event's worth, and one
    /// event larger than the room still goes out alone). Returns the room:
    /// the bytes the caller may now queue with [`Outbound::stored`].
    pub async fn wait_room(&self, want: usize, deadline: Duration) -> Result<usize, Overflow> {
        let budget = &self.shared.budget;
        budget.waiting.fetch_add(1, Ordering::SeqCst);
        let wait = async {
            loop {
                let mine = self.shared.drained.notified();
                let relay = budget.drained.notified();
                if self.shared.failed.load(Ordering::SeqCst) {
                    return Err(Overflow);
                }
                let room = self.max_bytes.saturating_sub(self.queued()).min(budget.room());
                if room >= want || self.queued() == 0 {
                    return Ok(room.max(1));
                }
                tokio::select! {
                    _ = mine => {}
                    _ = relay => {}
                }
            }
        };
        let r = tokio::time::timeout(deadline, wait).await;
        budget.waiting.fetch_sub(1, Ordering::SeqCst);
        r.map_err(|_| Overflow)?
    }

    /// Queues stored results within room the caller got from
    /// [`Outbound::wait_room`] (so: without the bounds' checks; a single
    /// frame may exceed the room, once).
    pub fn stored(&self, s: String) -> Result<(), Overflow> {
        let len = s.len();
        if self.shared.failed.load(Ordering::SeqCst) {
            return Err(Overflow);
        }
        self.shared.queued_bytes.fetch_add(len, Ordering::SeqCst);
        self.shared.budget.charge(len);
        self.send(Frame::Text(s), len, len)
    }

    /// Queues a text message, first waiting up to `deadline` for room.
    pub async fn text_wait(&self, s: String, deadline: Duration) -> Result<(), Overflow> {
        self.wait_room(s.len(), deadline).await?;
        self.stored(s)
    }

    /// Queues a close frame; the writer stops after sending it.
    pub fn close(&self, code: u16, reason: &str) {
        let frame = CloseFrame {
            code,
            reason: reason.to_string().into(),
        };
        let _ = self.tx.send(Box::new(Frame::Close(frame)));
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
