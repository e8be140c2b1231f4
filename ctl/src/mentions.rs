//! `relayctl mentions`: where managed agents take mentions (NIP-86
//! `setmentions`, `listmentions`; docs/protocol.md, "Mentions").

use clap::Subcommand;
use protocol::nip86::MentionSetting;
use serde_json::json;

use crate::client::Relay;
use crate::{hex_pubkey, Out};

#[derive(Subcommand)]
pub(crate) enum MentionsCommand {
    /// Turn an agent's mentions on: a kind 9 in the channel that p-tags
    /// it, by a member, becomes a delivery for it.
    On {
        /// The agent (hex or npub).
        agent: String,
        /// One channel; every channel of the community without it.
        #[arg(long)]
        channel: Option<String>,
    },
    /// Turn an agent's mentions off (open deliveries stay).
    Off {
        agent: String,
        #[arg(long)]
        channel: Option<String>,
    },
    /// Where agents take mentions (an owner sees its own agents).
    List,
}

pub(crate) async fn run(relay: &Relay, out: Out, command: MentionsCommand) -> anyhow::Result<()> {
    let (agent, on, channel) = match command {
        MentionsCommand::On { agent, channel } => (agent, true, channel),
        MentionsCommand::Off { agent, channel } => (agent, false, channel),
        MentionsCommand::List => {
            let rows: Vec<MentionSetting> = relay.rpc("listmentions", json!([])).await?;
            out.list(&rows, |m| {
                let channel = m.channel.as_deref().unwrap_or("*");
                println!("{}  {channel}  by {}", m.agent, m.by.as_deref().unwrap_or("-"));
            });
            return Ok(());
        }
    };
    let agent = hex_pubkey(&agent)?;
    let set: MentionSetting = relay.rpc("setmentions", json!([agent, on, channel])).await?;
    let state = if set.on { "on" } else { "off" };
    let place = set
        .channel
        .as_deref()
        .map_or("every channel".to_string(), |c| format!("channel {c}"));
    out.done(&format!("mentions of {} {state} in {place}", set.agent));
    Ok(())
}
