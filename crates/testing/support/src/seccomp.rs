//! A seccomp filter that makes `openat2` fail, with ENOSYS as a kernel before 5.6 or a container
//! runtime's profile does, or with EPERM as older profiles do: how the tests run the scratch
//! code where it must do without `openat2` (the scratch layer's unit tests, the node's
//! no_openat2 tests).

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7;

/// The filter's program: `openat2` fails with ENOSYS, everything else is allowed.
pub fn openat2_enosys() -> Vec<libc::sock_filter> {
    openat2_failing_with(libc::ENOSYS)
}

/// The filter's program: `openat2` fails with `errno`, everything else is allowed.
pub fn openat2_failing_with(errno: i32) -> Vec<libc::sock_filter> {
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jeq = |k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    };
    let load = |offset: u32| stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, offset);
    vec![
        load(4), // seccomp_data.arch
        jeq(AUDIT_ARCH, 0, 3),
        load(0), // seccomp_data.nr
        jeq(libc::SYS_openat2 as u32, 0, 1),
        stmt(
            libc::BPF_RET | libc::BPF_K,
            libc::SECCOMP_RET_ERRNO | errno as u32,
        ),
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
    ]
}

/// Puts `filter` on the calling thread, and on the threads and programs it starts. Only
/// async-signal-safe calls: it also runs between fork and exec.
pub fn install(filter: &[libc::sock_filter]) -> std::io::Result<()> {
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr().cast_mut(),
    };
    // SAFETY: plain system calls; `prog` points at `filter`, alive for the call.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            || libc::syscall(libc::SYS_seccomp, libc::SECCOMP_SET_MODE_FILTER, 0, &prog) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Runs `f` in a thread of its own under the filter, after checking that `openat2` answers
/// ENOSYS there.
pub fn without_openat2<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    with_openat2_failing(libc::ENOSYS, f)
}

/// Runs `f` in a thread of its own under the filter, after checking that `openat2` fails
/// with `errno` there.
pub fn with_openat2_failing<T: Send + 'static>(
    errno: i32,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    std::thread::spawn(move || {
        install(&openat2_failing_with(errno)).expect("seccomp filter");
        let how = rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY;
        let seen = rustix::fs::openat2(
            rustix::fs::CWD,
            "/",
            how,
            rustix::fs::Mode::empty(),
            rustix::fs::ResolveFlags::BENEATH,
        );
        assert_eq!(
            seen.err(),
            Some(rustix::io::Errno::from_raw_os_error(errno)),
            "the seccomp filter"
        );
        f()
    })
    .join()
    .unwrap()
}
