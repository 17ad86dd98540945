//! A pool of waiting worker threads, for the connect() decider
//! (unixconnect.rs): starting a thread per connect() cost more than
//! deciding it, and one connect() that blocks (a listener whose backlog is
//! full, a slow host) must not hold up the others. A job goes to an idle
//! worker, or to a new one when none is idle; past the bound the caller
//! gets it back and does it itself.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};

/// Every job sent meets either a worker counted in `idle` (claimed before
/// sending) or one started for it, so none waits behind a job in progress.
pub struct Pool<T> {
    tx: mpsc::Sender<T>,
    rx: Arc<Mutex<mpsc::Receiver<T>>>,
    idle: Arc<AtomicUsize>,
    workers: usize,
    max: usize,
    name: &'static str,
}

impl<T: Send + 'static> Pool<T> {
    pub fn new(name: &'static str, max: usize) -> Pool<T> {
        let (tx, rx) = mpsc::channel();
        Pool {
            tx,
            rx: Arc::new(Mutex::new(rx)),
            idle: Arc::new(AtomicUsize::new(0)),
            workers: 0,
            max,
            name,
        }
    }

    /// Hand `job` to a worker that runs `serve` on each job it gets; the
    /// job comes back when no worker is idle and none can start. Workers
    /// end when the pool is dropped.
    pub fn hand<F>(&mut self, job: T, serve: F) -> Option<T>
    where
        F: Fn(T) + Send + 'static,
    {
        let mut taken = self
            .idle
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if !taken && self.workers < self.max {
            let (rx, idle) = (self.rx.clone(), self.idle.clone());
            let spawned = std::thread::Builder::new()
                .name(self.name.into())
                .spawn(move || loop {
                    let next = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                    let Ok(job) = next else {
                        return;
                    };
                    serve(job);
                    idle.fetch_add(1, Ordering::SeqCst);
                });
            if spawned.is_ok() {
                self.workers += 1;
                taken = true;
            }
        }
        if !taken {
            return Some(job);
        }
        self.tx.send(job).err().map(|e| e.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_blocked_job_holds_up_no_other_and_workers_are_reused() {
        let mut pool = Pool::new("test-worker", 4);
        let (done_tx, done_rx) = mpsc::channel();
        let (gate_tx, gate_rx) = mpsc::channel::<()>();
        let gate = Arc::new(Mutex::new(gate_rx));
        let serve = move |(block, n): (bool, u32)| {
            if block {
                let _ = gate.lock().unwrap().recv();
            }
            let _ = done_tx.send(n);
        };
        assert!(pool.hand((true, 0), serve.clone()).is_none());
        // 50 jobs done one after another while one is blocked, by at most
        // four threads: none waited behind it, and workers were reused.
        for n in 1..=50 {
            // A worker that has just sent its result may not be idle yet
            // (a loaded machine): then the job comes back, and is handed
            // again a moment later.
            let mut job = (false, n);
            for _ in 0..1000 {
                match pool.hand(job, serve.clone()) {
                    None => break,
                    Some(back) => {
                        job = back;
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
            }
            assert_eq!(done_rx.recv_timeout(Duration::from_secs(10)), Ok(n));
        }
        assert!(pool.workers <= 4, "{}", pool.workers);
        // Once every worker is blocked, a job comes back to the caller.
        let came_back = (100..105).any(|n| pool.hand((true, n), serve.clone()).is_some());
        assert!(came_back);
        drop(gate_tx);
    }
}
