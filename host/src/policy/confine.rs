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
//!    under which opening, creating, renaming, linking or removing any file, changing modes or
//!    owners, mounting, creating a socket or connecting one, executing a program, tracing or
//!    reading another process, and `io_uring` fail with `EPERM`. What is left is what compiling
//!    needs: memory, threads, clocks, and the pipes it was given (stdin, the module; stdout,
//!    the artefact).
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
    install_filter()?;
    Ok(Confinement {
        uid: rustix::process::geteuid().as_raw(),
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

/// The system calls the filter forbids ([`EPERM`](libc::EPERM)), for this architecture.
fn forbidden() -> Vec<i64> {
    let mut calls = vec![
        // Files: open, create, name, remove, change.
        libc::SYS_openat,
        libc::SYS_openat2,
        libc::SYS_open_by_handle_at,
        libc::SYS_name_to_handle_at,
        libc::SYS_mkdirat,
        libc::SYS_mknodat,
        libc::SYS_unlinkat,
        libc::SYS_renameat2,
        libc::SYS_linkat,
        libc::SYS_symlinkat,
        libc::SYS_fchmod,
        libc::SYS_fchmodat,
        libc::SYS_fchown,
        libc::SYS_fchownat,
        libc::SYS_truncate,
        libc::SYS_chdir,
        libc::SYS_fchdir,
        libc::SYS_chroot,
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_acct,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        // Network.
        libc::SYS_socket,
        libc::SYS_socketpair,
        libc::SYS_connect,
        libc::SYS_bind,
        libc::SYS_listen,
        libc::SYS_accept,
        libc::SYS_accept4,
        // Other programs and processes.
        libc::SYS_execve,
        libc::SYS_execveat,
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_setns,
        libc::SYS_unshare,
        // Kernel interfaces a compiler has no use for (io_uring bypasses this filter's view
        // of file operations).
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_userfaultfd,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_kexec_load,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
    ];
    #[cfg(target_arch = "x86_64")]
    calls.extend([
        libc::SYS_open,
        libc::SYS_creat,
        libc::SYS_mkdir,
        libc::SYS_mknod,
        libc::SYS_rmdir,
        libc::SYS_unlink,
        libc::SYS_rename,
        libc::SYS_renameat,
        libc::SYS_link,
        libc::SYS_symlink,
        libc::SYS_chmod,
        libc::SYS_chown,
        libc::SYS_lchown,
        libc::SYS_uselib,
    ]);
    calls
}

fn install_filter() -> Result<(), String> {
    let arch = seccompiler::TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| format!("no system call filter for {}: {e}", std::env::consts::ARCH))?;
    let rules: BTreeMap<i64, Vec<seccompiler::SeccompRule>> = forbidden()
        .into_iter()
        .map(|call| (call, Vec::new()))
        .collect();
    let filter = seccompiler::SeccompFilter::new(
        rules,
        seccompiler::SeccompAction::Allow,
        seccompiler::SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(|e| format!("system call filter: {e}"))?;
    let program: seccompiler::BpfProgram = filter
        .try_into()
        .map_err(|e| format!("system call filter: {e}"))?;
    // Sets `no_new_privs` first: the filter, and the dropped privileges, hold for good. On every
    // thread (there is one), and on every thread started later (they inherit it).
    seccompiler::apply_filter_all_threads(&program).map_err(|e| format!("system call filter: {e}"))
}

/// What `--check-sandbox` found: the confinement, and the outcome of each forbidden operation
/// tried after it (`denied`, or what happened instead).
#[derive(Debug, Serialize)]
pub struct SandboxCheck {
    pub confinement: Option<Confinement>,
    pub error: Option<String>,
    pub read_file: String,
    pub create_file: String,
    pub socket: String,
    pub execute: String,
}

fn outcome<T>(result: std::io::Result<T>) -> String {
    match result {
        Ok(_) => "allowed".to_owned(),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => "denied".to_owned(),
        Err(e) => format!("failed: {e}"),
    }
}

/// Confines this process and tries what it must no longer do.
pub fn check() -> SandboxCheck {
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
    SandboxCheck {
        confinement,
        error,
        read_file: outcome(std::fs::File::open("/proc/self/exe")),
        create_file: outcome(created),
        socket: outcome(std::net::TcpListener::bind("127.0.0.1:0")),
        execute: outcome(std::process::Command::new("/bin/true").status()),
    }
}
