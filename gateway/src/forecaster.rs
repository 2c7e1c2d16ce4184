//! The forecast thread: start forecasts run off the loop thread. The
//! core prepares a request (a fork of the engine and the runtime
//! estimates, made on the loop), this thread runs it, and the loop steps
//! the answer in when it comes ([`crate::lifecycle::Input::Forecast`],
//! see `scheduler/forecast.rs`). One request is out at a time.

use std::sync::mpsc;
use std::time::Duration;

use peloton_engine::Forecast;

use crate::lifecycle::ForecastRequest;

/// While a request is out, the loop looks for its answer this often.
pub const POLL: Duration = Duration::from_millis(50);

/// A request out longer than this is given up, with its thread (a new
/// one takes the next).
const GIVE_UP_MS: u64 = 60_000;

/// The worker thread's ends of its channels (started on first use).
#[derive(Debug, Default)]
pub struct Forecaster {
    worker: Option<Worker>,
    /// A request is out.
    pub out: bool,
    /// When it was sent (the loop's clock, ms).
    sent_at: u64,
}

#[derive(Debug)]
struct Worker {
    requests: mpsc::SyncSender<ForecastRequest>,
    answers: mpsc::Receiver<Forecast>,
}

impl Forecaster {
    /// Hands a request to the worker; false if it could not take it (its
    /// thread is gone).
    pub fn send(&mut self, request: ForecastRequest, now: u64) -> bool {
        let worker = self.worker.get_or_insert_with(|| {
            let (requests, rx) = mpsc::sync_channel::<ForecastRequest>(1);
            let (tx, answers) = mpsc::channel();
            std::thread::Builder::new()
                .name("peloton-forecast".into())
                .spawn(move || {
                    for request in rx {
                        if tx.send(request.run()).is_err() {
                            return;
                        }
                    }
                })
                .expect("the forecast thread starts");
            Worker { requests, answers }
        });
        let sent = worker.requests.try_send(request).is_ok();
        if !sent {
            self.worker = None;
        }
        self.out = sent;
        self.sent_at = now;
        sent
    }

    /// The answer, if it came. A thread that ended without one (it
    /// panicked) or a request out too long is given up: the next request
    /// goes to a new thread.
    pub fn answer(&mut self, now: u64) -> Option<Forecast> {
        let worker = self.worker.as_ref()?;
        match worker.answers.try_recv() {
            Ok(answer) => {
                self.out = false;
                Some(answer)
            }
            Err(mpsc::TryRecvError::Disconnected) => {
                tracing::warn!("the forecast thread ended without an answer; starting another");
                self.worker = None;
                self.out = false;
                None
            }
            Err(mpsc::TryRecvError::Empty) => {
                if self.out && now >= self.sent_at.saturating_add(GIVE_UP_MS) {
                    tracing::warn!("a forecast took over {GIVE_UP_MS} ms; giving it up");
                    self.worker = None;
                    self.out = false;
                }
                None
            }
        }
    }
}
