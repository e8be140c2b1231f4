//! A small HTTP/1.1 server the tests start on loopback to receive the
//! relay's webhook calls: it records every request and answers as told
//! (status, JSON body, delay, a redirect).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

/// One request as received.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    /// Header names in lower case.
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(&name.to_ascii_lowercase()).map(String::as_str)
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("request body is JSON")
    }
}

/// How the server answers a path.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub body: String,
    pub delay: Duration,
    pub location: Option<String>,
}

impl Answer {
    pub fn json(status: u16, body: serde_json::Value) -> Answer {
        Answer {
            status,
            body: body.to_string(),
            delay: Duration::ZERO,
            location: None,
        }
    }
}

/// The running server; stops when dropped.
pub struct HookServer {
    pub addr: SocketAddr,
    received: Arc<Mutex<Vec<Received>>>,
    answers: Arc<Mutex<HashMap<String, Answer>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for HookServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl HookServer {
    /// Starts on 127.0.0.1 with a free port; unknown paths answer 404.
    pub async fn start() -> HookServer {
        Self::start_with(None).await
    }

    /// Starts serving HTTPS with a fresh self-signed certificate for `name`;
    /// returns the server and the certificate (PEM), for the relay to trust.
    pub async fn start_tls(name: &str) -> (HookServer, String) {
        let rcgen::CertifiedKey { cert, key_pair } =
            rcgen::generate_simple_self_signed(vec![name.to_string()]).expect("certificate");
        let key = tokio_rustls::rustls::pki_types::PrivateKeyDer::Pkcs8(key_pair.serialize_der().into());
        let config = tokio_rustls::rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], key)
            .expect("tls config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        (Self::start_with(Some(acceptor)).await, cert.pem())
    }

    async fn start_with(tls: Option<tokio_rustls::TlsAcceptor>) -> HookServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let received = Arc::new(Mutex::new(Vec::new()));
        let answers: Arc<Mutex<HashMap<String, Answer>>> = Arc::new(Mutex::new(HashMap::new()));
        let (r, a) = (received.clone(), answers.clone());
        let task = tokio::spawn(async move {
            // Bounded by the test: the task is aborted when the server drops.
            while let Ok((sock, _)) = listener.accept().await {
                let (r, a, tls) = (r.clone(), a.clone(), tls.clone());
                tokio::spawn(async move {
                    match tls {
                        Some(acceptor) => {
                            if let Ok(stream) = acceptor.accept(sock).await {
                                let _ = serve(stream, r, a).await;
                            }
                        }
                        None => {
                            let _ = serve(sock, r, a).await;
                        }
                    }
                });
            }
        });
        HookServer {
            addr,
            received,
            answers,
            task,
        }
    }

    /// Answers `path` with `answer` from now on.
    pub fn answer(&self, path: &str, answer: Answer) {
        self.answers.lock().unwrap().insert(path.to_string(), answer);
    }

    /// `http://127.0.0.1:<port><path>`
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Every request received so far on `path`.
    pub fn received(&self, path: &str) -> Vec<Received> {
        self.received
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.path == path)
            .cloned()
            .collect()
    }

    /// Every request received so far.
    pub fn all(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

async fn serve(
    mut sock: impl AsyncRead + AsyncWrite + Unpin,
    received: Arc<Mutex<Vec<Received>>>,
    answers: Arc<Mutex<HashMap<String, Answer>>>,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let head_end = loop {
        let mut chunk = [0u8; 4096];
        let n = sock.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > 64 * 1024 {
            return Ok(());
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or_default().split_whitespace();
    let method = first.next().unwrap_or_default().to_string();
    let path = first.next().unwrap_or_default().to_string();
    let headers: HashMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let length: usize = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
        .min(1024 * 1024);
    let mut body = buf[head_end..].to_vec();
    while body.len() < length {
        let mut chunk = vec![0u8; length - body.len()];
        let n = sock.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    received.lock().unwrap().push(Received {
        method,
        path: path.clone(),
        headers,
        body,
    });
    let answer = answers.lock().unwrap().get(&path).cloned();
    let answer = answer.unwrap_or(Answer::json(404, serde_json::json!({"error": "no such hook"})));
    tokio::time::sleep(answer.delay).await;
    let mut out = format!(
        "HTTP/1.1 {} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        answer.status,
        answer.body.len()
    );
    if let Some(loc) = &answer.location {
        out.push_str(&format!("location: {loc}\r\n"));
    }
    out.push_str("\r\n");
    out.push_str(&answer.body);
    sock.write_all(out.as_bytes()).await?;
    sock.shutdown().await
}
