//! Start forecasts in the loop: asks the core for a request when one is
//! due, hands it to the forecast thread ([`crate::forecaster`]) and steps
//! the answer in when it comes.

use super::Scheduler;
use crate::lifecycle::Input;

impl Scheduler {
    /// Steps in a forecast that came back, and asks for the next when due.
    pub(super) fn follow_forecasts(&mut self) {
        if let Some(answer) = self.forecaster.answer(self.now) {
            self.step(Input::Forecast(Box::new(answer)));
        }
        if !self.forecaster.out && self.core.forecast_due(&self.engine, self.now) {
            let request = self
                .core
                .forecast_request(&self.engine, self.config.forecast);
            if !self.forecaster.send(request, self.now) {
                tracing::warn!("the forecast thread is gone; starting another at the next try");
            }
        }
    }
}
