//! What faultline itself runs to take resources away: spinning threads (CPU) and held memory.

use anyhow::{Context, Result};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The duty cycle's period: short enough that the processes see a steady share, long enough
/// that the sleeps (1 ns timer slack is not set here: a late wake-up only shortens the spin)
/// are small against it.
const PERIOD: Duration = Duration::from_millis(10);

/// One spinning thread per CPU, each busy `share` of every period.
pub struct Spinners {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<Duration>>,
    started: Instant,
}

impl Spinners {
    pub fn start(share: f64, cpus: usize) -> Result<Spinners> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::with_capacity(cpus);
        for cpu in 0..cpus {
            let stop = stop.clone();
            let t = std::thread::Builder::new()
                .name(format!("cpu-hog-{cpu}"))
                .spawn(move || {
                    let mut set = nix::sched::CpuSet::new();
                    // pinned, so each CPU loses its share rather than the threads meeting on one
                    if set.set(cpu).is_ok() {
                        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
                    }
                    let busy = PERIOD.mul_f64(share);
                    while !stop.load(Ordering::Relaxed) {
                        let t = Instant::now();
                        while t.elapsed() < busy {
                            std::hint::spin_loop();
                        }
                        std::thread::sleep(PERIOD.saturating_sub(t.elapsed()));
                    }
                    thread_cpu_time()
                })
                .context("cannot start a CPU hog thread")?;
            threads.push(t);
        }
        Ok(Spinners { stop, threads, started: Instant::now() })
    }

    /// Stop; returns the CPUs' worth of time the threads really got (the scheduler may have
    /// given the processes some of what was asked for).
    pub fn stop(self) -> f64 {
        self.stop.store(true, Ordering::Relaxed);
        let wall = self.started.elapsed().as_secs_f64().max(1e-9);
        let used: Duration = self.threads.into_iter().filter_map(|t| t.join().ok()).sum();
        used.as_secs_f64() / wall
    }
}

fn thread_cpu_time() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID).map(Duration::from).unwrap_or_default()
}

/// Memory taken from the host: mapped, written (so it is really allocated) and locked.
pub struct Held {
    ptr: std::ptr::NonNull<std::ffi::c_void>,
    len: usize,
    pub locked: bool,
}

// SAFETY: the mapping is owned by this value alone and never read or written after `take`.
unsafe impl Send for Held {}

impl Held {
    pub fn take(bytes: u64) -> Result<Held> {
        use nix::sys::mman::{MapFlags, ProtFlags, mmap_anonymous};
        let len = usize::try_from(bytes).context("memory to hold does not fit in the address space")?;
        let nz = std::num::NonZeroUsize::new(len).context("memory to hold must be more than 0 bytes")?;
        // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
        let ptr = unsafe { mmap_anonymous(None, nz, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE, MapFlags::MAP_PRIVATE) }
            .context("cannot map the memory to hold")?;
        let mut held = Held { ptr, len, locked: false };
        // allocate every page now; MADV_POPULATE_WRITE (Linux 5.14) does it in the kernel
        const MADV_POPULATE_WRITE: i32 = 23;
        // SAFETY: the range is exactly our mapping.
        let populated = unsafe { libc::madvise(ptr.as_ptr(), len, MADV_POPULATE_WRITE) } == 0;
        if !populated {
            let page = 4096;
            let base = ptr.as_ptr() as *mut u8;
            for off in (0..len).step_by(page) {
                // SAFETY: `off < len`, inside our writable mapping.
                unsafe { base.add(off).write_volatile(1) };
            }
        }
        // SAFETY: the range is exactly our mapping.
        held.locked = unsafe { libc::mlock(ptr.as_ptr(), len) } == 0;
        Ok(held)
    }

    pub fn len(&self) -> u64 {
        self.len as u64
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // SAFETY: our own mapping of `len` bytes, unmapped once.
        let _ = unsafe { nix::sys::mman::munmap(self.ptr, self.len) };
    }
}
