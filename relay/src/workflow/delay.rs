//! The `delay` step: the run waits, durably, until the delay's end.

use protocol::workflow::{Delay, DelayOutput};

use super::step::{Next, RunStep, StepCtx, StepOutcome};
use crate::faults;
use crate::persistence::db::Tx;
use crate::persistence::StoreError;

impl RunStep for Delay {
    async fn start(&self, _: &mut Tx<'_>, c: &StepCtx<'_>, _: &mut StepOutcome) -> Result<Next, StoreError> {
        Ok(Next::Wait {
            wake_at: self.until(c.now),
        })
    }

    async fn resume(&self, _: &mut Tx<'_>, c: &StepCtx<'_>, _: &mut StepOutcome) -> Result<Next, StoreError> {
        let until = self.until(c.run.step_started_at.unwrap_or(c.now));
        if c.now < until {
            return Ok(Next::StillWaiting);
        }
        faults::check("delay:before_fire")?;
        Ok(c.done(self, &DelayOutput { until }))
    }
}
