//! The compile worker's confinement: what a process compiling an uploaded module may still do
//! once it starts, before it reads a byte of the module.
//!
//! A crafted module that exploited the compiler would run as this process. So the worker, after
//! its resource limits ([`super::compile`]):
//! 1. leaves the network: a network namespace of its own, with no interface but a loopback
//!    that is down (as root; otherwise inside a user namespace of its own when the kernel allows
//!    one — the system call filter below forbids sockets either way);
//! 2. drops its privileges: a worker started as root takes the user and group `nobody`
//!    ([`UNPRIVILEGED_ID`]) with no supplementary groups;
//! 3. can never gain any again (`no_new_privs`), and installs a system call filter (seccomp)
//!    that allows what compiling needs and refuses everything else with `EPERM`: memory,
//!    threads (`clone` of a thread, never of a process), its own signals (a signal only to its
//!    own threads), clocks, randomness, and reading and writing the descriptors it holds (stdin,
//!    the module; stdout, the artefact). Opening or naming any file, sockets, running a
//!    program, and every call that names another process (`kill`, `tgkill` of another
//!    process, `pidfd_open`, `pidfd_getfd`, `process_madvise`, `ptrace`, `process_vm_readv`)
//!    are off the list, as is every x32 system call number; a call through another ABI kills
//!    the worker.
//!
//! A worker started as the gateway's own (non-root) user keeps that user: an unprivileged user
//! namespace maps only its creator's uid, so another uid would need the privilege the gateway
//! does not have. It gets no PID namespace either: a new PID namespace holds only the
//! children of the process that creates it, and the worker would have to run as the init of
//! one, where its own `SIGABRT` (the memory limit's signal) is ignored. What the same user
//! could do to the gateway goes through the calls above, which the filter refuses.
//!
//! The engine is created, and the file the worker measures its peak memory from is opened,
//! before the filter goes on. A step that cannot be taken fails the compilation closed (the
//! gateway answers `503 policy_check_unavailable`), except the network namespace, which the
//! filter makes redundant and some containers refuse. `aura-gateway compile-worker
//! --check-sandbox` confines itself the same way, tries each forbidden operation, and prints
//! what happened.

use std::collections::BTreeMap;

use serde::Serialize;

/// The user and group id the worker takes when started as root (`nobody` on most systems).
pub const UNPRIVILEGED_ID: u32 = 65_534;

/// What the confinement achieved.
#[derive(Debug, Clone, Serialize)]
pub struct Confinement {
    /// The worker's user id once confined.
    pub uid: u32,
    /// Whether it is in a network namespace of its own.
    pub network_namespace: bool,
    /// Whether the system call filter is in force.
    pub seccomp: bool,
}

/// Confines the calling process (see the module documentation). It must have one thread: the
/// user and group are changed for the calling thread only, so a second thread would keep the
/// privileges (refused, naming the count).
pub fn confine() -> Result<Confinement, String> {
    let threads = std::fs::read_dir("/proc/self/task")
        .map(|tasks| tasks.count())
        .map_err(|e| format!("cannot count the worker's threads: {e}"))?;
    if threads != 1 {
        return Err(format!(
            "the worker has {threads} threads before its confinement; it must have one"
        ));
    }
    let root = rustix::process::geteuid().is_root();
    let network_namespace = leave_the_network(root);
    if root {
        let nobody_gid = rustix::process::Gid::from_raw(UNPRIVILEGED_ID);
        let nobody_uid = rustix::process::Uid::from_raw(UNPRIVILEGED_ID);
        rustix::thread::set_thread_groups(&[])
            .map_err(|e| format!("cannot drop the supplementary groups: {e}"))?;
        rustix::thread::set_thread_res_gid(nobody_gid, nobody_gid, nobody_gid)
            .map_err(|e| format!("cannot take group {UNPRIVILEGED_ID}: {e}"))?;
        rustix::thread::set_thread_res_uid(nobody_uid, nobody_uid, nobody_uid)
            .map_err(|e| format!("cannot take user {UNPRIVILEGED_ID}: {e}"))?;
    }
    // Read before the filter, which refuses it.
    let uid = rustix::process::geteuid().as_raw();
    install_filter()?;
    Ok(Confinement {
        uid,
        network_namespace,
        seccomp: true,
    })
}

/// Moves the process into a network namespace of its own; false when the kernel refuses.
#[expect(
    unsafe_code,
    reason = "unshare is unsafe only with CLONE_FILES; see the safety comment"
)]
fn leave_the_network(root: bool) -> bool {
    use rustix::thread::UnshareFlags;
    let flags = if root {
        UnshareFlags::NEWNET
    } else {
        UnshareFlags::NEWUSER | UnshareFlags::NEWNET
    };
    // SAFETY: only CLONE_NEWNET (and CLONE_NEWUSER) are asked for, never CLONE_FILES: no file
    // descriptor table is split, and the process has a single thread at this point.
    unsafe { rustix::thread::unshare_unsafe(flags) }.is_ok()
}

/// Set in the number of an x32 system call (the ILP32 ABI of x86-64): the same kernel entry
/// and architecture as x86-64, its own numbers. None is on the allow-list, so each is refused.
pub const X32_SYSCALL_BIT: i64 = 0x4000_0000;

/// The namespace flags of `clone`: a thread of the worker starts in its process's namespaces.
const CLONE_NAMESPACES: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u64;

/// The system calls the worker may make once confined, each with the conditions its
/// arguments must meet (none: any). Everything else fails with `EPERM`.
///
/// This is what compiling a module (cranelift on wasmtime's threads), the allocator and the
/// worker's own exchange with the gateway were seen to call, plus the paths they take when
/// they fail: an allocation refused under the data limit writes a line to stderr and aborts
/// (`tgkill` of its own thread with `SIGABRT`, which the gateway reads as the memory limit),
/// a panic writes and exits. Lookups that fail closed without harm are left out: the
/// allocator's NUMA probe (`access`), its naming of mappings (`prctl`), the CPU quota read
/// from `/proc` (`openat`), a file's size hint before reading it (`statx`, `newfstatat`).
fn allowed(pid: u32) -> Result<BTreeMap<i64, Vec<seccompiler::SeccompRule>>, String> {
    use seccompiler::{SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition, SeccompRule};
    let rule = |index: u8, len: Len, op: Op, value: u64| {
        SeccompCondition::new(index, len, op, value)
            .and_then(|condition| SeccompRule::new(vec![condition]))
            .map_err(|e| format!("system call filter: {e}"))
    };
    let mut calls: BTreeMap<i64, Vec<SeccompRule>> = [
        // Memory.
        libc::SYS_brk,
        libc::SYS_mmap,
        libc::SYS_munmap,
        libc::SYS_mremap,
        libc::SYS_mprotect,
        libc::SYS_madvise,
        // Threads: waiting, yielding, their CPU set, their registration with the kernel.
        libc::SYS_futex,
        libc::SYS_sched_yield,
        libc::SYS_sched_getaffinity,
        libc::SYS_set_robust_list,
        libc::SYS_rseq,
        libc::SYS_gettid,
        libc::SYS_getpid,
        libc::SYS_exit,
        libc::SYS_exit_group,
        // Signals of its own: handlers, masks, alternate stacks.
        libc::SYS_rt_sigaction,
        libc::SYS_rt_sigprocmask,
        libc::SYS_rt_sigreturn,
        libc::SYS_sigaltstack,
        libc::SYS_restart_syscall,
        // Time and randomness (when the vDSO does not answer them).
        libc::SYS_clock_gettime,
        libc::SYS_clock_getres,
        libc::SYS_gettimeofday,
        libc::SYS_clock_nanosleep,
        libc::SYS_nanosleep,
        libc::SYS_getrandom,
        // The descriptors it holds: the module in, the artefact out, its own status file.
        libc::SYS_read,
        libc::SYS_readv,
        libc::SYS_write,
        libc::SYS_writev,
        libc::SYS_lseek,
        libc::SYS_close,
        // A thread starts with `clone` (its flags checked below); `clone3`, whose flags the
        // filter cannot read, is answered `ENOSYS` by a second filter so that the C library
        // falls back to `clone`.
        libc::SYS_clone3,
    ]
    .into_iter()
    .map(|call| (call, Vec::new()))
    .collect();
    // Threads only: no new process (which would outlive the worker when it is killed), and no
    // thread in namespaces of its own.
    let thread = libc::CLONE_THREAD as u64;
    calls.insert(
        libc::SYS_clone,
        vec![rule(
            0,
            Len::Qword,
            Op::MaskedEq(thread | CLONE_NAMESPACES),
            thread,
        )?],
    );
    // A signal to its own threads only: `abort` sends `SIGABRT` with `tgkill(getpid(), ..)`.
    calls.insert(
        libc::SYS_tgkill,
        vec![rule(0, Len::Dword, Op::Eq, u64::from(pid))?],
    );
    Ok(calls)
}

/// Installs the filter: the allow-list ([`allowed`]), default `EPERM`, and the architecture
/// check (a call made through another ABI, `int 0x80` on x86-64, kills the process). An x32
/// number is no number on the list: refused like any other.
fn install_filter() -> Result<(), String> {
    let arch = seccompiler::TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| format!("no system call filter for {}: {e}", std::env::consts::ARCH))?;
    let build = |rules, otherwise, matched| -> Result<seccompiler::BpfProgram, String> {
        let filter = seccompiler::SeccompFilter::new(rules, otherwise, matched, arch)
            .map_err(|e| format!("system call filter: {e}"))?;
        filter
            .try_into()
            .map_err(|e| format!("system call filter: {e}"))
    };
    let allow_list = build(
        allowed(std::process::id())?,
        seccompiler::SeccompAction::Errno(libc::EPERM as u32),
        seccompiler::SeccompAction::Allow,
    )?;
    let no_clone3 = build(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        seccompiler::SeccompAction::Allow,
        seccompiler::SeccompAction::Errno(libc::ENOSYS as u32),
    )?;
    // Sets `no_new_privs` first: the filters, and the dropped privileges, hold for good. On
    // every thread (there is one), and on every thread started later (they inherit them). Of
    // two filters' answers the kernel takes the stricter: `clone3` is `ENOSYS`. The allow-list
    // goes last: it refuses installing another.
    for program in [&no_clone3, &allow_list] {
        seccompiler::apply_filter_all_threads(program)
            .map_err(|e| format!("system call filter: {e}"))?;
    }
    Ok(())
}

/// What `--check-sandbox` found: the confinement, and the outcome of each operation tried after
/// it (`denied`, `allowed`, or how it failed otherwise). Every one but `thread` and
/// `signal_own_thread` (which compiling needs) must be `denied`.
#[derive(Debug, Serialize)]
pub struct SandboxCheck {
    pub confinement: Option<Confinement>,
    pub error: Option<String>,
    pub read_file: String,
    pub create_file: String,
    pub socket: String,
    pub execute: String,
    /// A new process (`fork`).
    pub fork: String,
    /// Signal 0 to the target (`kill`): the process that started the check, or
    /// `--target-pid`.
    pub kill: String,
    /// Signal 0 to the target's main thread (`tgkill`).
    pub tgkill: String,
    /// A descriptor of the target (`pidfd_open`).
    pub pidfd_open: String,
    /// A descriptor taken from another process (`pidfd_getfd`).
    pub pidfd_getfd: String,
    /// Advice on another process's memory (`process_madvise`).
    pub process_madvise: String,
    /// `getpid` by its x32 number.
    pub x32: String,
    /// A thread started and joined: `allowed`.
    pub thread: String,
    /// Signal 0 to its own thread (what `abort` sends its `SIGABRT` with): `allowed`.
    pub signal_own_thread: String,
}

fn outcome<T>(result: std::io::Result<T>) -> String {
    match result {
        Ok(_) => "allowed".to_owned(),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => "denied".to_owned(),
        Err(e) => format!("failed: {e}"),
    }
}

/// System call `number` with `args`, made directly: what the filter answers, not what a
/// library wrapper makes of it.
#[expect(unsafe_code, reason = "a raw system call; see the safety comment")]
fn raw_call(number: i64, args: [i64; 5]) -> std::io::Result<i64> {
    // SAFETY: the calls made through this take integers only (process ids, descriptors,
    // signal 0, flags, a null vector of length 0): the kernel reads or writes no memory of
    // this process for them.
    let r = unsafe { libc::syscall(number, args[0], args[1], args[2], args[3], args[4]) };
    if r == -1 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Forks, the child leaving at once.
#[expect(unsafe_code, reason = "fork and _exit; see the safety comment")]
fn try_fork() -> std::io::Result<()> {
    // SAFETY: the check runs on one thread (its confinement requires it), so the child holds
    // no lock another thread held; it calls nothing but `_exit`.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(std::io::Error::last_os_error()),
        0 => unsafe { libc::_exit(0) },
        child => {
            let mut status = 0;
            // SAFETY: `status` is a valid place for the child's status.
            unsafe { libc::waitpid(child, &mut status, 0) };
            Ok(())
        }
    }
}

/// Confines this process and tries what it must no longer do, and what compiling still needs.
/// Signals and process descriptors are aimed at `target`, or at the process that started the
/// check: a target of the worker's own user shows that the filter refuses them, not the
/// kernel's permission checks.
pub fn check(target: Option<u32>) -> SandboxCheck {
    let target = match target {
        Some(pid) => i64::from(pid),
        None => i64::from(rustix::process::getppid().map_or(1, |p| p.as_raw_nonzero().get())),
    };
    let confined = confine();
    let (confinement, error) = match confined {
        Ok(c) => (Some(c), None),
        Err(e) => (None, Some(e)),
    };
    let scratch = std::env::temp_dir().join(format!(
        "aura-sandbox-check-{}",
        uuid::Uuid::new_v4().simple()
    ));
    let created = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&scratch);
    if created.is_ok() {
        let _ = std::fs::remove_file(&scratch);
    }
    let pidfd = raw_call(libc::SYS_pidfd_open, [target, 0, 0, 0, 0]);
    if let Ok(fd) = pidfd {
        let _ = raw_call(libc::SYS_close, [fd, 0, 0, 0, 0]);
    }
    let own = i64::from(std::process::id());
    let thread = std::thread::Builder::new().spawn(|| ()).and_then(|t| {
        t.join()
            .map_err(|_| std::io::Error::other("the thread panicked"))
    });
    SandboxCheck {
        confinement,
        error,
        read_file: outcome(std::fs::File::open("/proc/self/exe")),
        create_file: outcome(created),
        socket: outcome(std::net::TcpListener::bind("127.0.0.1:0")),
        execute: outcome(std::process::Command::new("/bin/true").status()),
        fork: outcome(try_fork()),
        kill: outcome(raw_call(libc::SYS_kill, [target, 0, 0, 0, 0])),
        tgkill: outcome(raw_call(libc::SYS_tgkill, [target, target, 0, 0, 0])),
        pidfd_open: outcome(pidfd),
        pidfd_getfd: outcome(raw_call(libc::SYS_pidfd_getfd, [-1, 0, 0, 0, 0])),
        process_madvise: outcome(raw_call(libc::SYS_process_madvise, [-1, 0, 0, 0, 0])),
        x32: outcome(raw_call(X32_SYSCALL_BIT | libc::SYS_getpid, [0; 5])),
        thread: outcome(thread),
        signal_own_thread: outcome(raw_call(
            libc::SYS_tgkill,
            [
                own,
                i64::from(rustix::thread::gettid().as_raw_nonzero().get()),
                0,
                0,
                0,
            ],
        )),
    }
}
