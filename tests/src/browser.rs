//! Headless Chromium driven over WebDriver (chromedriver + fantoccini),
//! with a NIP-07 signer injected into the page: `window.nostr` queues what
//! the page asks to sign, and a task of the test signs it with the test's
//! key and hands it back. The page's own code runs unchanged, as with a
//! signer extension.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use nostr::prelude::{EventBuilder, FinalizeEvent, Keys, Kind, Tag, Timestamp};
use serde_json::{json, Value};

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";

/// How long a wait for the page may take.
const WAIT: Duration = Duration::from_secs(20);

/// The injected signer: `getPublicKey` answers the key given as
/// `arguments[0]`; `signEvent` waits until the test has signed. It also
/// records in `__pageErrors` every error the page shows (`#error`) and
/// every one its console would: uncaught exceptions, unhandled
/// rejections, resources that failed to load, Content-Security-Policy
/// violations and `console.error` calls.
const SIGNER_JS: &str = r#"
const pubkey = arguments[0];
window.__signQueue = [];
window.__signWaiters = {};
window.__pageErrors = [];
new MutationObserver(() => {
  const e = document.getElementById("error");
  if (e && e.textContent) window.__pageErrors.push(e.textContent);
}).observe(document.body, { childList: true, subtree: true });
window.addEventListener("error", (e) => window.__pageErrors.push(
  "console: " + (e.message || ("failed to load " + ((e.target && (e.target.src || e.target.href)) || e.type)))), true);
window.addEventListener("unhandledrejection", (e) => window.__pageErrors.push("console: unhandled rejection: " + String(e.reason)));
document.addEventListener("securitypolicyviolation", (e) => window.__pageErrors.push(
  "console: CSP refused " + e.blockedURI + " (" + e.violatedDirective + ")"));
const consoleError = console.error;
console.error = (...args) => { window.__pageErrors.push("console: " + args.join(" ")); consoleError.apply(console, args); };
window.nostr = {
  getPublicKey: async () => pubkey,
  signEvent: (ev) => new Promise((resolve) => {
    const id = String(Math.random()).slice(2);
    window.__signWaiters[id] = resolve;
    window.__signQueue.push({ id, ev });
  }),
};
"#;

/// Whether the browser tests can run here; under `CI=true` they must.
pub fn available() -> bool {
    let present = std::path::Path::new(CHROMEDRIVER).exists() && std::path::Path::new(CHROMIUM).exists();
    if !present && std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("CI=true: the browser tests need {CHROMIUM} and {CHROMEDRIVER} (Debian chromium, chromium-driver)");
    }
    present
}

/// One browser session, signed in as nobody until [`Browser::sign_in_as`].
pub struct Browser {
    pub client: Client,
    driver: Child,
    _profile: tempfile::TempDir,
    pump: Option<tokio::task::JoinHandle<()>>,
}

impl Browser {
    pub async fn start() -> Browser {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let profile = tempfile::tempdir().expect("profile dir");
        let args = vec![
            "--headless=new".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-dev-shm-usage".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--window-size=1280,900".into(),
            format!("--user-data-dir={}", profile.path().display()),
        ];
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({"binary": CHROMIUM, "args": args}),
        );
        let url = format!("http://127.0.0.1:{port}");
        let mut last = String::new();
        for _ in 0..100 {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(caps.clone())
                .connect(&url)
                .await
            {
                Ok(client) => {
                    return Browser {
                        client,
                        driver,
                        _profile: profile,
                        pump: None,
                    }
                }
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("chromedriver did not start a session: {last}");
    }

    /// Opens `url`, injects a signer for `keys` and clicks "Sign in".
    pub async fn sign_in_as(&mut self, url: &str, keys: &Keys) {
        self.client.goto(url).await.expect("open the page");
        self.wait_for("#signin-button").await;
        self.client
            .execute(SIGNER_JS, vec![json!(keys.public_key().to_hex())])
            .await
            .expect("inject the signer");
        if let Some(old) = self.pump.take() {
            old.abort();
        }
        self.pump = Some(tokio::spawn(pump(self.client.clone(), Arc::new(keys.clone()))));
        self.click("#signin-button").await;
    }

    /// The errors the page has shown (`#error`, "Something went wrong")
    /// since the last sign-in.
    pub async fn page_errors(&self) -> Vec<String> {
        let v = self
            .client
            .execute("return window.__pageErrors || [];", vec![])
            .await
            .expect("read the page's errors");
        serde_json::from_value(v).unwrap_or_default()
    }

    /// Forgets the errors recorded so far.
    pub async fn clear_page_errors(&self) {
        self.client
            .execute("window.__pageErrors = [];", vec![])
            .await
            .expect("clear the page's errors");
    }

    /// Runs axe-core (from npm, `tests/js`) on the page as it is now, with
    /// the WCAG 2 A and AA rules; returns each violation of impact
    /// `serious` or `critical`: its rule, impact, help and first elements.
    pub async fn accessibility(&self) -> Vec<String> {
        let loaded = self
            .client
            .execute(
                &format!("{}\n;return typeof axe;", crate::node::axe_source()),
                vec![],
            )
            .await
            .expect("load axe-core into the page");
        assert_eq!(loaded, json!("object"), "axe-core did not load");
        let found = self
            .client
            .execute_async(
                "const done = arguments[arguments.length - 1];\
                 axe.run(document, {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa']}})\
                   .then((r) => done(r.violations\
                     .filter((v) => v.impact === 'serious' || v.impact === 'critical')\
                     .map((v) => `${v.id} (${v.impact}): ${v.help}: ` +\
                       v.nodes.slice(0, 3).map((n) => n.target.join(' ')).join(', '))))\
                   .catch((e) => done(['axe failed: ' + e]));",
                vec![],
            )
            .await
            .expect("run axe-core");
        serde_json::from_value(found).unwrap_or_default()
    }

    /// Waits for an element matching `css`.
    pub async fn wait_for(&self, css: &str) -> fantoccini::elements::Element {
        self.client
            .wait()
            .at_most(WAIT)
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css} within {WAIT:?}: {e}"))
    }

    /// Clicks the element matching `css`; found again when the page drew
    /// it anew between the finding and the click (a live update), a
    /// bounded number of times.
    pub async fn click(&self, css: &str) {
        let mut last = None;
        for _ in 0..5 {
            match self.wait_for(css).await.click().await {
                Ok(()) => return,
                Err(e) if e.to_string().contains("stale element") => last = Some(e),
                Err(e) => panic!("click {css}: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("click {css}: still stale: {last:?}");
    }

    /// Waits until the text of `css` contains `needle`; returns the text.
    pub async fn wait_text(&self, css: &str, needle: &str) -> String {
        let mut last = String::new();
        let rounds = WAIT.as_millis() / 100;
        for _ in 0..rounds {
            if let Ok(e) = self.client.find(Locator::Css(css)).await {
                last = e.text().await.unwrap_or_default();
                if last.contains(needle) {
                    return last;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{css} never contained {needle:?}; last: {last:?}");
    }

    /// Goes to a route of the page (`#/…`) and waits for it to be drawn.
    pub async fn show(&self, hash: &str) {
        let before = self.rendered().await;
        self.client
            .execute("location.hash = arguments[0];", vec![json!(hash)])
            .await
            .expect("navigate");
        for _ in 0..(WAIT.as_millis() / 50) {
            if self.rendered().await != before {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{hash} was not drawn");
    }

    async fn rendered(&self) -> Value {
        self.client
            .execute(
                "return document.getElementById('main').getAttribute('data-rendered');",
                vec![],
            )
            .await
            .unwrap_or(Value::Null)
    }

    /// Saves a PNG of the page as `target/screenshots/<name>.png`, and
    /// into `docs/screenshots/` when `UPDATE_SCREENSHOTS=1`.
    pub async fn screenshot(&self, name: &str) {
        let png = self.client.screenshot().await.expect("screenshot");
        let mut dirs = vec![crate::workspace_root().join("target/screenshots")];
        if std::env::var("UPDATE_SCREENSHOTS").is_ok_and(|v| v == "1") {
            dirs.push(crate::workspace_root().join("docs/screenshots"));
        }
        for dir in dirs {
            std::fs::create_dir_all(&dir).expect("screenshot dir");
            let path: PathBuf = dir.join(format!("{name}.png"));
            std::fs::write(&path, &png).expect("write screenshot");
        }
    }

    pub async fn close(mut self) {
        if let Some(p) = self.pump.take() {
            p.abort();
        }
        let _ = self.client.clone().close().await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if let Some(p) = self.pump.take() {
            p.abort();
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// Signs what the page queued, for as long as the session lasts.
async fn pump(client: Client, keys: Arc<Keys>) {
    loop {
        let queued = client
            .execute(
                "const q = window.__signQueue || []; window.__signQueue = []; return q;",
                vec![],
            )
            .await;
        if let Ok(Value::Array(items)) = queued {
            for item in items {
                let signed = sign(&keys, &item["ev"]);
                let _ = client
                    .execute(
                        "const w = window.__signWaiters[arguments[0]]; delete window.__signWaiters[arguments[0]]; if (w) w(arguments[1]);",
                        vec![item["id"].clone(), signed],
                    )
                    .await;
            }
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

/// Signs an unsigned NIP-07 event (`kind`, `tags`, `content`, `created_at`).
fn sign(keys: &Keys, ev: &Value) -> Value {
    let tags: Vec<Tag> = ev["tags"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| {
            let parts: Vec<String> = t
                .as_array()?
                .iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect();
            Tag::parse(parts).ok()
        })
        .collect();
    let kind = u16::try_from(ev["kind"].as_u64().unwrap_or(1)).unwrap_or(1);
    let event = EventBuilder::new(Kind::from_u16(kind), ev["content"].as_str().unwrap_or_default())
        .tags(tags)
        .custom_created_at(Timestamp::from_secs(ev["created_at"].as_u64().unwrap_or(0)))
        .finalize(keys)
        .expect("sign");
    serde_json::to_value(&event).expect("event json")
}
