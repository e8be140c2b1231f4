//! Tasks that get an OS thread of their own, driven by a single-threaded
//! tokio runtime: the store's two writers (event batches, grouped calls)
//! and the workflow engine.
//!
//! Why: these tasks hold the one write lock of the store across several
//! statements. On PostgreSQL they await the database once per statement
//! (it answers over a socket); SQLite's writer runs each statement on the
//! calling thread (`persistence::lite`), which must then be one that may block
//! for the statement's microseconds. (When sqlx ran the SQLite writer on
//! its own worker thread, every statement woke the awaiting task.) On the relay's
//! shared runtime such a wake-up from outside lands in the global queue,
//! behind whatever the workers are busy with (HTTP calls, WebSocket
//! frames), and every statement of a transaction pays that wait again while
//! the lock is held. Measured in the delivery benchmark: a group commit of
//! a single call took 1.4 ms on the shared runtime, 0.6 ms on its own
//! thread. On its own thread a task is polled as soon as the OS runs it.
//!
//! Such a task ends by itself (a writer when every sender of its queue is
//! gone, the engine at shutdown) or when aborted; its thread ends with it.

use std::future::Future;

use tokio::task::AbortHandle;

/// Runs `task` on a new thread named `name`; the handle aborts it.
pub fn spawn<F>(name: &str, task: F) -> std::io::Result<AbortHandle>
where
    F: Future<Output = ()> + Send + 'static,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let task = runtime.spawn(task);
    let abort = task.abort_handle();
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            // Ends when the task does (or is aborted).
            let _ = runtime.block_on(task);
        })?;
    Ok(abort)
}
