//! `thunderbolt service install | uninstall | status`: the host as a user
//! service that survives the terminal and reboots.
//!
//! Linux: a systemd user unit, `Type=notify` (the host says `READY=1` once it
//! listens, `STOPPING=1` when it shuts down, and feeds the watchdog), restarted
//! on failure, stopped with `KillMode=mixed` (SIGTERM to the host alone, which
//! ends every agent itself; only what is left after it exits is killed).
//! `loginctl enable-linger` makes it start at boot without a login. macOS: a
//! LaunchAgent (`RunAtLoad`, `KeepAlive`, logs under the home).
//!
//! The unit runs this binary by its absolute path with the same
//! `THUNDERBOLT_HOME`, and never carries a secret: of the environment only
//! the network and app settings are written (a token is not: `thunderbolt
//! login` stores it in the home, where the service finds it).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result};

use crate::home::Home;

/// The service manager to write for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Manager {
    /// A systemd user unit (Linux).
    Systemd,
    /// A launchd LaunchAgent (macOS).
    Launchd,
}

impl Manager {
    /// This machine's.
    pub fn here() -> Self {
        if cfg!(target_os = "macos") {
            Self::Launchd
        } else {
            Self::Systemd
        }
    }
}

/// The unit's name.
pub const SYSTEMD_UNIT: &str = "thunderbolt-host.service";
/// The LaunchAgent's label.
pub const LAUNCHD_LABEL: &str = "dev.thunderbolt.host";

/// How long the service manager waits for the host to end every session
/// before it kills what is left: the agents' SIGTERM grace plus margin.
const STOP_TIMEOUT_SECS: u64 = 20;

/// Environment the unit keeps from the installing shell: settings, never secrets.
const KEPT_ENV: [&str; 8] = [
    "THUNDERBOLT_IROH_RELAY_URL",
    "THUNDERBOLT_IROH_DISCOVERY",
    "THUNDERBOLT_IROH_PORTMAPPER",
    "THUNDERBOLT_IROH_BIND",
    "THUNDERBOLT_IROH_RELAY_CA",
    "THUNDERBOLT_CLOUD_URL",
    "THUNDERBOLT_APP_URL",
    "RUST_LOG",
];

/// A unit file: where it goes and what it says.
#[derive(Debug, Clone)]
pub struct Unit {
    pub manager: Manager,
    pub path: PathBuf,
    pub text: String,
}

/// The environment written into the unit: `THUNDERBOLT_HOME`, then the kept settings set now.
fn environment(home: &Home) -> Vec<(String, String)> {
    let mut env = vec![("THUNDERBOLT_HOME".to_string(), home.root_path().display().to_string())];
    for k in KEPT_ENV {
        if let Ok(v) = std::env::var(k) {
            env.push((k.to_string(), v));
        }
    }
    env
}

/// The unit for `manager`, running `exe` on `home`.
pub fn unit(manager: Manager, exe: &Path, home: &Home, user_home: &Path) -> Unit {
    let env = environment(home);
    match manager {
        Manager::Systemd => {
            let config = std::env::var_os("XDG_CONFIG_HOME")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .unwrap_or_else(|| user_home.join(".config"));
            let path = config.join("systemd/user").join(SYSTEMD_UNIT);
            Unit { manager, path, text: systemd_text(exe, home, &env) }
        }
        Manager::Launchd => {
            let path = user_home.join("Library/LaunchAgents").join(format!("{LAUNCHD_LABEL}.plist"));
            Unit { manager, path, text: launchd_text(exe, home, &env) }
        }
    }
}

/// A value in a systemd unit: quoted, with `%` (specifiers), `"` and `\` escaped.
fn systemd_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '%' => out.push_str("%%"),
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn systemd_text(exe: &Path, home: &Home, env: &[(String, String)]) -> String {
    let mut s = String::new();
    s.push_str("# Written by `thunderbolt service install`; `thunderbolt service uninstall` removes it.\n");
    s.push_str("[Unit]\n");
    s.push_str(&format!(
        "Description=thunderbolt agent host (the agents of {}/agents.d, over iroh)\n",
        home.root_path().display()
    ));
    s.push_str("\n[Service]\n");
    s.push_str("Type=notify\nNotifyAccess=main\n");
    s.push_str(&format!("ExecStart={} host\n", systemd_quote(&exe.display().to_string())));
    for (k, v) in env {
        s.push_str(&format!("Environment={}\n", systemd_quote(&format!("{k}={v}"))));
    }
    s.push_str("Restart=on-failure\nRestartSec=2\n");
    s.push_str("# SIGTERM goes to the host alone, which ends every agent itself; whatever is\n");
    s.push_str("# left when it has exited is killed then, never a process mid-write before.\n");
    s.push_str(&format!("KillMode=mixed\nTimeoutStopSec={STOP_TIMEOUT_SECS}\n"));
    s.push_str("WatchdogSec=60\n");
    s.push_str("\n[Install]\nWantedBy=default.target\n");
    s
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

fn launchd_text(exe: &Path, home: &Home, env: &[(String, String)]) -> String {
    let logs = home.root_path().join("logs");
    let mut vars = String::new();
    for (k, v) in env {
        vars.push_str(&format!("    <key>{}</key>\n    <string>{}</string>\n", xml(k), xml(v)));
    }
    format!(
        r#"<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<!-- Written by `thunderbolt service install`; `thunderbolt service uninstall` removes it. -->
<plist version="1.0">
<dict>
  <key>Label</key>
  <string>{LAUNCHD_LABEL}</string>
  <key>ProgramArguments</key>
  <array>
    <string>{exe}</string>
    <string>host</string>
  </array>
  <key>EnvironmentVariables</key>
  <dict>
{vars}  </dict>
  <key>RunAtLoad</key>
  <true/>
  <key>KeepAlive</key>
  <true/>
  <key>ProcessType</key>
  <string>Background</string>
  <key>ExitTimeOut</key>
  <integer>{STOP_TIMEOUT_SECS}</integer>
  <key>StandardOutPath</key>
  <string>{out}</string>
  <key>StandardErrorPath</key>
  <string>{err}</string>
</dict>
</plist>
"#,
        exe = xml(&exe.display().to_string()),
        out = xml(&logs.join("host.out.log").display().to_string()),
        err = xml(&logs.join("host.log").display().to_string()),
    )
}

/// Runs a service manager command, saying what it runs; its failure is reported, not fatal.
fn run(cmd: &[&str]) -> bool {
    println!("  $ {}", cmd.join(" "));
    match Command::new(cmd[0]).args(&cmd[1..]).status() {
        Ok(s) if s.success() => true,
        Ok(s) => {
            println!("    (exited {s}; run it yourself once the service manager is available)");
            false
        }
        Err(e) => {
            println!("    (could not run {}: {e}; run it yourself where it is available)", cmd[0]);
            false
        }
    }
}

/// `service install`: writes the unit (unless it is there already, unchanged) and enables it.
pub fn install(unit: &Unit, dry_run: bool) -> Result<()> {
    if std::env::var_os("THUNDERBOLT_TOKEN").is_some() {
        eprintln!(
            "note: THUNDERBOLT_TOKEN is set but is not written into the unit (it is a secret); run \
             `thunderbolt login --cloud-url URL --token -` so the service finds the credential in the home"
        );
    }
    if dry_run {
        println!("# {}\n{}", unit.path.display(), unit.text);
        return Ok(());
    }
    let current = std::fs::read_to_string(&unit.path).ok();
    if current.as_deref() == Some(unit.text.as_str()) {
        println!("{} is installed already (unchanged)", unit.path.display());
    } else {
        if let Some(dir) = unit.path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        }
        crate::home::write_secure_atomic(&unit.path, unit.text.as_bytes())?;
        println!("wrote {}", unit.path.display());
    }
    match unit.manager {
        Manager::Systemd => {
            run(&["systemctl", "--user", "daemon-reload"]);
            run(&["systemctl", "--user", "enable", "--now", SYSTEMD_UNIT]);
            let user = std::env::var("USER").unwrap_or_else(|_| "$USER".into());
            println!("To start it at boot, before anyone logs in (once, as yourself):");
            println!("  loginctl enable-linger {user}");
            println!("Its log: journalctl --user -u {SYSTEMD_UNIT} -f");
        }
        Manager::Launchd => {
            // SAFETY: getuid cannot fail.
            let uid = unsafe { libc::getuid() };
            run(&["launchctl", "bootstrap", &format!("gui/{uid}"), &unit.path.display().to_string()]);
        }
    }
    Ok(())
}

/// `service uninstall`: stops and disables the service, removes the unit.
pub fn uninstall(unit: &Unit, dry_run: bool) -> Result<()> {
    if dry_run {
        println!("would stop the service and remove {}", unit.path.display());
        return Ok(());
    }
    match unit.manager {
        Manager::Systemd => {
            run(&["systemctl", "--user", "disable", "--now", SYSTEMD_UNIT]);
        }
        Manager::Launchd => {
            // SAFETY: getuid cannot fail.
            let uid = unsafe { libc::getuid() };
            run(&["launchctl", "bootout", &format!("gui/{uid}/{LAUNCHD_LABEL}")]);
        }
    }
    match std::fs::remove_file(&unit.path) {
        Ok(()) => println!("removed {}", unit.path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            println!("{} was not installed", unit.path.display())
        }
        Err(e) => return Err(e).with_context(|| format!("cannot remove {}", unit.path.display())),
    }
    if unit.manager == Manager::Systemd {
        run(&["systemctl", "--user", "daemon-reload"]);
    }
    Ok(())
}

/// `service status`: installed or not, and what the service manager says.
pub fn status(unit: &Unit) -> Result<()> {
    match std::fs::read_to_string(&unit.path) {
        Ok(_) => println!("installed: {}", unit.path.display()),
        Err(_) => {
            println!("not installed ({} is absent): `thunderbolt service install`", unit.path.display())
        }
    }
    if unit.manager == Manager::Systemd {
        run(&["systemctl", "--user", "--no-pager", "status", SYSTEMD_UNIT]);
    } else {
        run(&["launchctl", "print", &format!("gui/{}/{LAUNCHD_LABEL}", unsafe { libc::getuid() })]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_quote_what_they_carry_and_keep_no_secret() {
        std::env::set_var("THUNDERBOLT_TOKEN", "sekrit");
        let home = Home::new(PathBuf::from("/home/u/100%/.thunderbolt"));
        let u = unit(Manager::Systemd, Path::new("/opt/tb/thunderbolt"), &home, Path::new("/home/u"));
        assert!(u.path.ends_with("systemd/user/thunderbolt-host.service"));
        assert!(u.text.contains("ExecStart=\"/opt/tb/thunderbolt\" host"));
        assert!(u.text.contains("Environment=\"THUNDERBOLT_HOME=/home/u/100%%/.thunderbolt\""));
        assert!(u.text.contains("Type=notify") && u.text.contains("KillMode=mixed"));
        assert!(!u.text.contains("sekrit"));
        let p = unit(Manager::Launchd, Path::new("/opt/tb/thunderbolt"), &home, Path::new("/home/u"));
        assert!(p.text.contains("<key>RunAtLoad</key>") && !p.text.contains("sekrit"));
        std::env::remove_var("THUNDERBOLT_TOKEN");
    }
}
