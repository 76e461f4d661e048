//! A team of threads for one decoder: the step's matrix products and attention heads are
//! split between them, and between two pieces of work the helpers spin instead of
//! sleeping (as ggml's thread pool does). A decode step of the embedded model is about
//! 120 pieces of work (per layer: q, k and v; attention; the output projection; gate and
//! up; down; then the output head) of tens to hundreds of microseconds; waking a sleeping
//! worker (a futex call, rayon's fork-join) costs about as much as the work, so a second
//! core gained nothing (docs/performance.md, "Embedded local model").
//!
//! A team is `Send` but not `Sync`: only the thread that owns it starts work, one piece at
//! a time, and a job cannot reach the team (a job must be `Sync`), so no job is ever
//! started while another runs. One thread per core per team: two teams of two threads on
//! two cores make progress (a waiting thread yields its core after a while) but slowly.
//!
//! A helper that has seen no work for [`PARK_AFTER`] parks on a condition variable, so an
//! idle decoder (between requests) costs no CPU.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a helper spins, with no work, before it parks.
const PARK_AFTER: Duration = Duration::from_millis(2);

/// The job the helpers run: `(index, team size)`. Its lifetime is erased: [`Team::run`]
/// returns only once every helper has finished it.
type Job = *const (dyn Fn(usize, usize) + Sync);

struct Shared {
    /// Bumped once per job; a helper runs the job when it sees a new value.
    epoch: AtomicUsize,
    /// Helpers done with the current job.
    done: AtomicUsize,
    /// A helper's job panicked.
    panicked: AtomicBool,
    stop: AtomicBool,
    /// Helpers parked or about to park (changed under `lock`).
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    job: UnsafeCell<Option<Job>>,
    /// Threads in the team (set once, before the first job).
    size: AtomicUsize,
}

// SAFETY: `job` is written only by the thread that owns the team (`Team` is not `Sync`,
// and `run` returns before it is called again), before it publishes the write with
// `epoch` (SeqCst), and read by helpers after they see that epoch (Acquire); it is not
// written again until every helper has counted itself `done`.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

pub(crate) struct Team {
    size: usize,
    shared: Arc<Shared>,
    helpers: Vec<JoinHandle<()>>,
    /// Not `Sync` (see the module docs).
    _owned: std::marker::PhantomData<std::cell::Cell<()>>,
}

impl Team {
    /// A team of `size` threads: this one and `size - 1` helpers (fewer when the system
    /// refuses a thread: the team is then as large as it could be made).
    pub(crate) fn new(size: usize) -> Self {
        let shared = Arc::new(Shared {
            epoch: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            job: UnsafeCell::new(None),
            size: AtomicUsize::new(1),
        });
        let mut team = Self {
            size: 1,
            shared,
            helpers: Vec::new(),
            _owned: std::marker::PhantomData,
        };
        for index in 1..size.max(1) {
            let shared = Arc::clone(&team.shared);
            let spawned = std::thread::Builder::new()
                .name(format!("pieval-llama-{index}"))
                .spawn(move || helper(&shared, index));
            match spawned {
                Ok(handle) => team.helpers.push(handle),
                Err(_) => break,
            }
        }
        team.size = team.helpers.len() + 1;
        team.shared.size.store(team.size, Ordering::Relaxed);
        team
    }

    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// Run `job(index, size)` on every thread of the team (index 0 here) and return when
    /// all are done. A panic in a helper's part is raised here.
    pub(crate) fn run(&self, job: &(dyn Fn(usize, usize) + Sync)) {
        if self.size == 1 {
            job(0, 1);
            return;
        }
        let s = &*self.shared;
        // SAFETY: the lifetime is erased only until every helper is done (below).
        let erased: Job = unsafe {
            std::mem::transmute::<
                &(dyn Fn(usize, usize) + Sync),
                &'static (dyn Fn(usize, usize) + Sync),
            >(job)
        };
        // SAFETY: no helper reads `job` now: all counted themselves done with the last one.
        unsafe { *s.job.get() = Some(erased) };
        s.done.store(0, Ordering::Relaxed);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        // This thread's part; a panic here still waits for the helpers before unwinding.
        let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(0, self.size)));
        let mut spins = 0u32;
        while s.done.load(Ordering::Acquire) < self.size - 1 {
            pause(&mut spins);
        }
        let helper_panicked = s.panicked.swap(false, Ordering::Relaxed);
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        if helper_panicked {
            panic!("a decoder thread panicked");
        }
    }
}

impl Team {
    /// `f(unit)` for every unit of `0..units`, each once, on the team's threads when
    /// `parallel`: each thread takes the next unit not yet taken (one atomic add), so a
    /// thread that started late or runs slower takes fewer and all finish together.
    pub(crate) fn for_each(&self, units: usize, parallel: bool, f: &(dyn Fn(usize) + Sync)) {
        if !parallel || self.size == 1 || units < 2 {
            (0..units).for_each(f);
            return;
        }
        let next = AtomicUsize::new(0);
        self.run(&|_, _| {
            loop {
                let unit = next.fetch_add(1, Ordering::Relaxed);
                if unit >= units {
                    break;
                }
                f(unit);
            }
        });
    }
}

/// One wait in a spin: a pause instruction at first; after [`SPINS_BEFORE_YIELD`] of them
/// the time slice is given up instead, so that a thread of the team that the system did
/// not schedule (more busy threads than cores: two decoders at once, a build beside) gets
/// a core, rather than waiting out the spinner's time slice.
#[inline]
fn pause(spins: &mut u32) {
    *spins = spins.wrapping_add(1);
    if *spins < SPINS_BEFORE_YIELD {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// Tens of microseconds of pause instructions (a pause takes 10 to 140 cycles, by CPU).
const SPINS_BEFORE_YIELD: u32 = 2000;

fn helper(s: &Shared, index: usize) {
    let mut seen = 0usize;
    loop {
        let mut idle = Instant::now();
        let mut spins = 0u32;
        loop {
            let epoch = s.epoch.load(Ordering::Acquire);
            if epoch != seen {
                seen = epoch;
                break;
            }
            if s.stop.load(Ordering::Relaxed) {
                return;
            }
            if spins % 1024 != 1023 || idle.elapsed() < PARK_AFTER {
                pause(&mut spins);
                continue;
            }
            let guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.sleepers.fetch_add(1, Ordering::SeqCst);
            let guard = if s.epoch.load(Ordering::SeqCst) == seen && !s.stop.load(Ordering::SeqCst)
            {
                s.wake.wait(guard).unwrap_or_else(|e| e.into_inner())
            } else {
                guard
            };
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
            drop(guard);
            idle = Instant::now();
        }
        // SAFETY: the job was written before the epoch this thread acquired, and stays
        // valid until this thread counts itself done.
        let job = unsafe { (*s.job.get()).expect("a job with its epoch") };
        let size = s.size.load(Ordering::Relaxed);
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe {
            (*job)(index, size)
        }));
        if ran.is_err() {
            s.panicked.store(true, Ordering::Relaxed);
        }
        s.done.fetch_add(1, Ordering::Release);
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        let s = &*self.shared;
        s.stop.store(true, Ordering::SeqCst);
        {
            let _guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        for h in self.helpers.drain(..) {
            let _ = h.join();
        }
    }
}

/// The part `[start, end)` of `0..len` that thread `index` of `size` takes: contiguous
/// (a thread streams its part of a weight matrix from memory front to back, which this
/// machine's prefetchers serve best: units of 64 rows taken in turn were 15% slower), in
/// multiples of `align` but for the last.
pub(crate) fn share(len: usize, index: usize, size: usize, align: usize) -> (usize, usize) {
    let units = len.div_ceil(align);
    let per = units / size;
    let extra = units % size;
    let start_unit = index * per + index.min(extra);
    let end_unit = start_unit + per + usize::from(index < extra);
    ((start_unit * align).min(len), (end_unit * align).min(len))
}

/// A pointer to an output buffer whose disjoint parts the team's threads write.
#[derive(Clone, Copy)]
pub(crate) struct Out(*mut f32, usize);

// SAFETY: each thread writes only indices of its own share (see the callers).
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

impl Out {
    pub(crate) fn new(out: &mut [f32]) -> Self {
        Self(out.as_mut_ptr(), out.len())
    }

    /// Write `v` at `i`.
    ///
    /// # Safety
    /// No other thread reads or writes index `i` while the team runs, and the buffer
    /// outlives the run.
    #[inline(always)]
    pub(crate) unsafe fn set(self, i: usize, v: f32) {
        assert!(i < self.1);
        unsafe { *self.0.add(i) = v };
    }

    /// The part `[start, end)` as a slice.
    ///
    /// # Safety
    /// As [`Out::set`], for every index of the part.
    pub(crate) unsafe fn part<'a>(self, start: usize, end: usize) -> &'a mut [f32] {
        assert!(start <= end && end <= self.1);
        unsafe { std::slice::from_raw_parts_mut(self.0.add(start), end - start) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_cover_the_range_once_in_aligned_parts() {
        for len in [0, 1, 31, 32, 33, 576, 1536, 49152, 49153] {
            for size in 1..5 {
                let mut next = 0;
                for i in 0..size {
                    let (s, e) = share(len, i, size, 32);
                    assert_eq!(s, next, "len {len} size {size} part {i}");
                    assert!(s <= e);
                    if e < len {
                        assert_eq!(e % 32, 0);
                    }
                    next = e;
                }
                assert_eq!(next, len);
            }
        }
    }

    #[test]
    fn every_thread_runs_every_job_and_parked_helpers_wake() {
        let team = Team::new(3);
        let hits: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
        for round in 0..2000 {
            team.run(&|i, n| {
                assert_eq!(n, 3);
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            if round == 1000 {
                // Long enough for every helper to park.
                std::thread::sleep(PARK_AFTER * 5);
            }
        }
        for h in &hits {
            assert_eq!(h.load(Ordering::Relaxed), 2000);
        }
    }

    #[test]
    fn for_each_runs_every_unit_once() {
        let team = Team::new(2);
        for units in [0, 1, 2, 3, 100, 10_000] {
            let seen: Vec<AtomicUsize> = (0..units).map(|_| AtomicUsize::new(0)).collect();
            team.for_each(units, true, &|u| {
                seen[u].fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                seen.iter().all(|c| c.load(Ordering::Relaxed) == 1),
                "{units}"
            );
        }
    }

    #[test]
    fn a_helpers_panic_is_raised_by_run_and_the_team_goes_on() {
        let team = Team::new(2);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            team.run(&|i, _| assert!(i != 1, "helper fails"));
        }));
        assert!(r.is_err());
        // Both parts fail: the next run still succeeds (no panic left over).
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            team.run(&|_, _| panic!("every part fails"));
        }));
        assert!(r.is_err());
        let ran = AtomicUsize::new(0);
        team.run(&|_, _| {
            ran.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(ran.load(Ordering::Relaxed), 2);
    }
}
