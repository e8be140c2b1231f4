//! A small Agent Client Protocol agent for the tests: on each prompt it asks
//! permission for a write tool call, and only once granted appends the
//! prompt to the file named by `ACP_TEST_SIDE_EFFECT_FILE` (its side
//! effect); then it streams a reply in two chunks.

use std::io::Write;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, ContentBlock, ContentChunk, InitializeRequest, InitializeResponse, NewSessionRequest,
    NewSessionResponse, PermissionOption, PermissionOptionKind, PromptRequest, PromptResponse,
    RequestPermissionOutcome, RequestPermissionRequest, SessionNotification, SessionUpdate, StopReason,
    TextContent, ToolCallUpdate, ToolCallUpdateFields, ToolKind,
};
use agent_client_protocol::{Agent, Stdio};

#[tokio::main]
async fn main() -> agent_client_protocol::Result<()> {
    let _ = ProtocolVersion::V1;
    Agent
        .v1()
        .name("acp-test-agent")
        .on_receive_request(
            async move |req: InitializeRequest, responder, _cx| {
                responder.respond(InitializeResponse::new(req.protocol_version).agent_capabilities(AgentCapabilities::new()))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |_req: NewSessionRequest, responder, _cx| {
                let id = format!("s{}", std::process::id() as u64 * 1000 + rand_suffix());
                responder.respond(NewSessionResponse::new(id))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |req: PromptRequest, responder, cx| {
                let text: String = req
                    .prompt
                    .iter()
                    .filter_map(|b| if let ContentBlock::Text(t) = b { Some(t.text.clone()) } else { None })
                    .collect::<Vec<_>>()
                    .join("\n");
                let session = req.session_id.clone();
                let cx2 = cx.clone();
                cx.spawn(async move {
                    let tool = ToolCallUpdate::new(
                        "write-side-effect",
                        ToolCallUpdateFields::new().kind(ToolKind::Edit).title("write side effect"),
                    );
                    let options = vec![
                        PermissionOption::new("allow", "Allow", PermissionOptionKind::AllowOnce),
                        PermissionOption::new("deny", "Deny", PermissionOptionKind::RejectOnce),
                    ];
                    let answer = cx2
                        .send_request(RequestPermissionRequest::new(session.clone(), tool, options))
                        .block_task()
                        .await?;
                    let granted = matches!(&answer.outcome, RequestPermissionOutcome::Selected(s) if s.option_id.to_string() == "allow");
                    if granted {
                        if let Ok(path) = std::env::var("ACP_TEST_SIDE_EFFECT_FILE") {
                            let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).expect("side effect file");
                            writeln!(f, "{}", text.replace('\n', " ")).expect("write side effect");
                        }
                    }
                    for part in ["acp says: ", text.as_str()] {
                        let chunk = ContentChunk::new(ContentBlock::Text(TextContent::new(part)));
                        cx2.send_notification(SessionNotification::new(session.clone(), SessionUpdate::AgentMessageChunk(chunk)))?;
                    }
                    responder.respond(PromptResponse::new(if granted { StopReason::EndTurn } else { StopReason::Refusal }))
                })
            },
            agent_client_protocol::on_receive_request!(),
        )
        .connect_to(Stdio::new())
        .await
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::SeqCst)
}
