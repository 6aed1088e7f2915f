//! The container image: `deploy/rootfs.sh` and `deploy/Containerfile.prebuilt` (the runtime stage
//! of the Dockerfile, from a binary built outside a container) built with podman, then the
//! gateway run from it: non-root, health check, ports, a graceful stop.
//!
//! The flags passed to podman are the ones this kind of sandbox needs (runc, cgroupfs, file
//! events, limits within the host's); they change nothing elsewhere.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::support::config::binary;
use crate::support::free_port;

fn podman(args: &[&str]) -> Output {
    Command::new("podman")
        .args([
            "--runtime",
            "runc",
            "--cgroup-manager",
            "cgroupfs",
            "--events-backend",
            "file",
        ])
        .args(args)
        .output()
        .expect("podman must be installed (the test command installs it)")
}

fn ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Removes the container and the image when the test ends, passed or not.
struct Cleanup {
    container: String,
    image: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = podman(&["rm", "-f", "-t", "0", &self.container]);
        let _ = podman(&["rmi", "-f", &self.image]);
    }
}

#[tokio::test]
async fn the_image_runs_the_gateway_as_a_non_root_user_with_a_health_check() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // The test binary without its debug sections (the release image's binary has none either).
    let stripped = dir.path().join("aura-gateway");
    let strip = Command::new("strip")
        .arg("-o")
        .arg(&stripped)
        .arg(binary())
        .output()
        .expect("strip (binutils)");
    ok(&strip, "strip");
    let rootfs = Command::new("bash")
        .arg(repo.join("deploy/rootfs.sh"))
        .arg(&stripped)
        .arg(dir.path().join("context"))
        .output()
        .expect("rootfs.sh");
    ok(&rootfs, "deploy/rootfs.sh");
    let tag = format!("localhost/aura-gateway-test:{}", std::process::id());
    let name = format!("aura-gateway-test-{}", std::process::id());
    let _cleanup = Cleanup {
        container: name.clone(),
        image: tag.clone(),
    };
    let build = podman(&[
        "build",
        "--format",
        "docker",
        "-q",
        "-f",
        &repo
            .join("deploy/Containerfile.prebuilt")
            .display()
            .to_string(),
        "-t",
        &tag,
        &dir.path().join("context").display().to_string(),
    ]);
    ok(&build, "podman build");

    // What the image declares.
    let inspect = ok(
        &podman(&[
            "image",
            "inspect",
            "--format",
            "{{.Config.User}}|{{json .Config.ExposedPorts}}|{{json .Config.Healthcheck}}|{{json .Config.Entrypoint}}",
            &tag,
        ]),
        "inspect",
    );
    let parts: Vec<&str> = inspect.split('|').collect();
    assert_eq!(parts[0], "65532:65532", "{inspect}");
    assert!(
        parts[1].contains("8000/tcp") && parts[1].contains("8001/tcp"),
        "{inspect}"
    );
    assert!(
        parts[2].contains("aura-gateway") && parts[2].contains("health"),
        "{inspect}"
    );
    assert!(
        parts[3].contains("/usr/local/bin/aura-gateway"),
        "{inspect}"
    );

    // Run it: DB-less, local limits, nothing else needed.
    let (port, management_port) = (free_port(), free_port());
    let run = podman(&[
        "run",
        "-d",
        "--name",
        &name,
        "--network",
        "host",
        "--ulimit",
        "nofile=20000:20000",
        "--ulimit",
        "nproc=32768:32768",
        "-e",
        "AURA_HOST=127.0.0.1",
        "-e",
        &format!("AURA_PORT={port}"),
        "-e",
        &format!("AURA_MANAGEMENT_PORT={management_port}"),
        "-e",
        "AURA_SERVER__DRAIN_DELAY_SECS=1",
        &tag,
    ]);
    ok(&run, "podman run");
    let started = Instant::now();
    let health = format!("http://127.0.0.1:{port}/health");
    loop {
        if let Ok(r) = reqwest::get(&health).await
            && r.status() == reqwest::StatusCode::OK
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the gateway in the container did not answer; logs:\n{}",
            String::from_utf8_lossy(&podman(&["logs", &name]).stderr)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = reqwest::get(format!("http://127.0.0.1:{management_port}/health"))
        .await
        .expect("management plane");
    assert_eq!(r.status(), reqwest::StatusCode::OK);
    // The image's own health check, run by the engine.
    let check = podman(&["healthcheck", "run", &name]);
    ok(&check, "podman healthcheck run");
    // Not root inside.
    let pid = ok(
        &podman(&["inspect", "--format", "{{.State.Pid}}", &name]),
        "inspect",
    );
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("process status");
    let uids = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .expect("Uid line")
        .split_whitespace()
        .skip(1)
        .collect::<Vec<_>>();
    assert!(uids.iter().all(|u| *u == "65532"), "{uids:?}");
    // SIGTERM: drained, then a clean exit.
    ok(&podman(&["stop", "-t", "20", &name]), "podman stop");
    let code = ok(
        &podman(&["inspect", "--format", "{{.State.ExitCode}}", &name]),
        "inspect",
    );
    assert_eq!(code, "0", "exit code after SIGTERM");
    let logs = podman(&["logs", &name]);
    let text =
        String::from_utf8_lossy(&logs.stderr).to_string() + &String::from_utf8_lossy(&logs.stdout);
    assert!(text.contains("SIGTERM received"), "{text}");
}
