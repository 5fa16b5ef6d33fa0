//! Where a section's processes run. By default the scheduler puts the bench's
//! client, `connect`, the bridge and its agent wherever a core is free, and on
//! two cores how it happens to share them moves a transfer by a tenth or
//! more either way. [`Split`] gives the bridge and its agent one half of the
//! CPUs and the client's side (this process, `connect`) the other, as when
//! they are two machines: the bridge's own cost then shows in its throughput.

use std::{mem, os::unix::process::CommandExt as _};

use anyhow::{bail, Result};

/// A set of CPUs, as the kernel takes it.
#[derive(Clone, Copy)]
struct Cpus(libc::cpu_set_t);

impl Cpus {
    /// The CPUs this thread may run on.
    fn allowed() -> Result<Self> {
        // SAFETY: a zeroed cpu_set_t is the empty set; the kernel writes at
        // most its size.
        let mut set: libc::cpu_set_t = unsafe { mem::zeroed() };
        if unsafe { libc::sched_getaffinity(0, mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
            bail!("sched_getaffinity: {}", std::io::Error::last_os_error());
        }
        Ok(Self(set))
    }

    fn list(&self) -> Vec<usize> {
        // SAFETY: CPU_ISSET reads the set within CPU_SETSIZE.
        (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &self.0) }).collect()
    }

    fn of(cpus: &[usize]) -> Self {
        // SAFETY: as in `allowed`; CPU_SET writes within CPU_SETSIZE.
        let mut set: libc::cpu_set_t = unsafe { mem::zeroed() };
        for &c in cpus {
            unsafe { libc::CPU_SET(c, &mut set) };
        }
        Self(set)
    }

    /// Binds thread (or process) `tid` (0: the caller) to these CPUs.
    fn bind(&self, tid: libc::pid_t) -> std::io::Result<()> {
        // SAFETY: the set is a valid cpu_set_t of the size given.
        match unsafe { libc::sched_setaffinity(tid, mem::size_of::<libc::cpu_set_t>(), &self.0) } {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        }
    }
}

/// The CPUs halved between the bridge's side and the client's.
pub struct Split {
    client: Cpus,
    bridge: Cpus,
    all: Cpus,
}

impl Split {
    /// `None` on a machine that gives this process one CPU.
    pub fn new() -> Result<Option<Self>> {
        let all = Cpus::allowed()?;
        let cpus = all.list();
        if cpus.len() < 2 {
            return Ok(None);
        }
        let (client, bridge) = cpus.split_at(cpus.len() / 2);
        Ok(Some(Self { client: Cpus::of(client), bridge: Cpus::of(bridge), all }))
    }

    /// How many CPUs the client's side and the bridge's have, for the row names.
    pub fn sides(&self) -> (usize, usize) {
        (self.client.list().len(), self.bridge.list().len())
    }

    /// Starts `c` (the bridge) on the bridge's side; its agent inherits it.
    pub fn bridge_side(&self, c: &mut tokio::process::Command) {
        pin_child(c, self.bridge);
    }

    /// Starts `c` (`connect`) on the client's side.
    pub fn client_side(&self, c: &mut tokio::process::Command) {
        pin_child(c, self.client);
    }

    /// Moves every thread of this process (the client's runtime) to the
    /// client's side, until the guard is dropped.
    pub fn enter(&self) -> Result<ClientSide<'_>> {
        each_thread(self.client)?;
        Ok(ClientSide(self))
    }
}

/// This process on the client's side of a [`Split`]; everywhere again once dropped.
pub struct ClientSide<'a>(&'a Split);

impl Drop for ClientSide<'_> {
    fn drop(&mut self) {
        if let Err(e) = each_thread(self.0.all) {
            eprintln!("bench: this process stays on the client's CPUs: {e}");
        }
    }
}

fn pin_child(c: &mut tokio::process::Command, cpus: Cpus) {
    // SAFETY: the closure only makes a system call (async-signal-safe) and
    // touches nothing of the parent's.
    unsafe {
        c.as_std_mut().pre_exec(move || cpus.bind(0));
    }
}

/// Binds every thread of this process (those there now; a thread made later
/// inherits its maker's CPUs).
fn each_thread(cpus: Cpus) -> Result<()> {
    for entry in std::fs::read_dir("/proc/self/task")? {
        let Some(tid) = entry?.file_name().to_str().and_then(|t| t.parse::<libc::pid_t>().ok()) else {
            continue;
        };
        match cpus.bind(tid) {
            Ok(()) => {}
            // A thread that ended since the listing.
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            Err(e) => bail!("sched_setaffinity of thread {tid}: {e}"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One test at a time: binding this process's threads moves the other
    /// tests' threads too.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn a_split_binds_this_process_to_the_client_side_and_back() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        let Some(split) = Split::new().unwrap() else { return };
        let before = Cpus::allowed().unwrap().list();
        {
            let _in = split.enter().unwrap();
            let now = Cpus::allowed().unwrap().list();
            assert_eq!(now, split.client.list());
            assert!(now.len() < before.len());
            assert!(now.iter().all(|c| !split.bridge.list().contains(c)), "the sides share no CPU");
        }
        assert_eq!(Cpus::allowed().unwrap().list(), before);
    }

    /// The CPUs a child process reports it may run on.
    fn child_cpus(pin: impl FnOnce(&mut tokio::process::Command)) -> Vec<usize> {
        let mut c = tokio::process::Command::new("grep");
        c.args(["Cpus_allowed_list", "/proc/self/status"]);
        pin(&mut c);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let out = rt.block_on(async { c.output().await }).unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let list = text.split(':').nth(1).expect("Cpus_allowed_list: …").trim();
        list.split(',')
            .flat_map(|r| {
                let (a, b) = r.split_once('-').unwrap_or((r, r));
                a.parse::<usize>().unwrap()..=b.parse::<usize>().unwrap()
            })
            .collect()
    }

    #[test]
    fn each_side_starts_its_processes_on_its_own_cpus() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        let Some(split) = Split::new().unwrap() else { return };
        assert_eq!(child_cpus(|c| split.bridge_side(c)), split.bridge.list());
        assert_eq!(child_cpus(|c| split.client_side(c)), split.client.list());
        assert_eq!(child_cpus(|_| {}), Cpus::allowed().unwrap().list(), "unpinned, a child has them all");
    }
}
