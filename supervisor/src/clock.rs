//! The monotonic clock the supervisor and the sandbox helper both mark
//! their steps on, so `-vv` can line up the two processes' timings.

/// CLOCK_MONOTONIC in nanoseconds: the clock the sandbox helper marks its
/// setup steps on.
pub fn monotonic_ns() -> i128 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills the struct it is given.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) } != 0 {
        return 0;
    }
    i128::from(t.tv_sec) * 1_000_000_000 + i128::from(t.tv_nsec)
}
