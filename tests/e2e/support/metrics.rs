//! Reading what the gateway exposes about itself: Prometheus samples and a process's memory.

/// The sum of the samples of `name` whose labels contain every one of `labels`
/// (`plane="data"`), in a Prometheus text exposition.
pub fn metric(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Resident memory of process `pid`, in KiB (`None` when it cannot be read).
pub fn rss_kib(pid: &str) -> Option<f64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
}

/// Resident memory of process `pid`, in MiB (0 when it cannot be read).
pub fn rss_mib(pid: u32) -> f64 {
    rss_kib(&pid.to_string()).map_or(0.0, |kib| kib / 1024.0)
}

/// Resident memory of this test process, in MiB (0 when it cannot be read).
pub fn own_rss_mib() -> f64 {
    rss_kib("self").map_or(0.0, |kib| kib / 1024.0)
}
