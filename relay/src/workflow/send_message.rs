//! The `send_message` step: posts its message and the deliveries of its
//! managed-agent recipients, and ends at once.

use protocol::workflow::{OnFailure, SendMessage, SendMessageOutput};

use super::message::{post, Addressed, Rows};
use super::step::{Next, RunStep, StepCtx, StepOutcome};
use crate::persistence::db::Tx;
use crate::persistence::StoreError;

impl RunStep for SendMessage {
    async fn start(&self, tx: &mut Tx<'_>, c: &StepCtx<'_>, out: &mut StepOutcome) -> Result<Next, StoreError> {
        Ok(match post(tx, c, out, Rows::Plain, |t| Addressed::mentions(c, t, self.reply_in_thread)).await? {
            Ok(message) => c.done(
                self,
                &SendMessageOutput {
                    event_id: message.id.to_hex(),
                    text: message.content,
                },
            ),
            Err(why) => c.failed(self, None, why, OnFailure::Fail),
        })
    }
}
