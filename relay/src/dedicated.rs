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
//! gone, the engine at shutdown) or when aborted. Its runtime, and so its
//! thread, ends only later, when `linger` is cancelled (the store does so
//! once its pool is closed): a PostgreSQL connection the task opened went
//! back to the pool that every task shares, and its socket is served by
//! this runtime's I/O driver. Dropping the runtime with the task broke
//! those connections for whoever took them next ("A Tokio 1.x context was
//! found, but it is being shutdown"): at SIGTERM the engine stopped first,
//! and the event writer, still answering the events the connections had
//! read, failed whole batches on its connections.

use std::future::Future;

use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;

/// Runs `task` on a new thread named `name`, whose runtime keeps serving
/// the I/O the task left behind until `linger` is cancelled; the handle
/// aborts the task.
pub fn spawn<F>(name: &str, task: F, linger: CancellationToken) -> std::io::Result<AbortHandle>
where
    F: Future<Output = ()> + Send + 'static,
{
    spawn_thread(name, task, linger).map(|(abort, _thread)| abort)
}

fn spawn_thread<F>(
    name: &str,
    task: F,
    linger: CancellationToken,
) -> std::io::Result<(AbortHandle, std::thread::JoinHandle<()>)>
where
    F: Future<Output = ()> + Send + 'static,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let task = runtime.spawn(task);
    let abort = task.abort_handle();
    let thread = std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            runtime.block_on(async move {
                // Ends when the task does (or is aborted).
                let _ = task.await;
                linger.cancelled().await;
            });
        })?;
    Ok((abort, thread))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    /// A socket opened by a dedicated task that has ended stays usable
    /// from another runtime until `linger` is cancelled (the way a pooled
    /// PostgreSQL connection outlives the task that opened it), and only
    /// then fails, with the error the relay's writers used to meet.
    #[tokio::test]
    async fn a_socket_outlives_its_task_until_linger_ends() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (sent, opened) = tokio::sync::oneshot::channel();
        let linger = CancellationToken::new();
        let task = async move {
            let _ = sent.send(TcpStream::connect(addr).await.unwrap());
        };
        let (abort, thread) = spawn_thread("test-dedicated", task, linger.clone()).unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        let mut client = opened.await.unwrap();
        while !abort.is_finished() {
            tokio::task::yield_now().await;
        }
        let mut byte = [0u8; 1];
        for round in 0..3u8 {
            client
                .write_all(&[round])
                .await
                .expect("write after the task ended");
            server.read_exact(&mut byte).await.unwrap();
            server.write_all(&byte).await.unwrap();
            client
                .read_exact(&mut byte)
                .await
                .expect("read after the task ended");
            assert_eq!(byte[0], round);
        }
        linger.cancel();
        tokio::task::spawn_blocking(move || thread.join().unwrap())
            .await
            .unwrap();
        let gone = client
            .read_exact(&mut byte)
            .await
            .expect_err("its runtime is gone");
        assert!(gone.to_string().contains("being shutdown"), "{gone}");
    }
}
