//! `thunderbolt devices scope`: what a device may do, shown or changed
//! without pairing again, and applied by running bridges at once.

use anyhow::{bail, Result};
use serde_json::json;

use super::args::DevicesScopeArgs;
use crate::{
    devices::{now_ms, scope::Scope, Devices},
    home::Home,
};

pub fn scope(home: &Home, a: DevicesScopeArgs) -> Result<()> {
    let devices = Devices::new(home);
    let id = match devices.resolve(&a.device) {
        Ok(id) => id,
        Err(why) => bail!("'{}': {why} (`thunderbolt iroh list` shows them); nothing was changed", a.device),
    };
    let Some(device) = devices.get(&id) else {
        bail!(
            "'{}' is not a device known here (it never paired nor connected): `thunderbolt iroh list` shows them; nothing was changed",
            a.device
        );
    };
    let label = device.name.clone().unwrap_or_else(|| id.fmt_short().to_string());
    let before = device.scope.clone().unwrap_or_else(Scope::full);
    let changes =
        a.owner || a.scope.is_some() || !a.agent.is_empty() || a.all_agents || a.for_.is_some() || a.no_end;
    let after = if a.owner {
        Scope::full()
    } else {
        let mut s = before.clone();
        if let Some(v) = a.scope {
            s.verbs = v;
        }
        if !a.agent.is_empty() {
            s.agents = Some(a.agent.clone());
        }
        if a.all_agents {
            s.agents = None;
        }
        if let Some(d) = a.for_ {
            s.until_ms = Some(now_ms().saturating_add(d.as_millis() as u64));
        }
        if a.no_end {
            s.until_ms = None;
        }
        s
    };
    let mut ended = 0u64;
    if changes {
        if !devices.set_scope(&id, Some(after.clone()))? {
            bail!("'{}' was removed meanwhile; nothing was changed", a.device);
        }
        // Running bridges apply it now rather than at their next look at the file.
        ended = crate::control::client::each(home, |c| c.recheck())
            .into_iter()
            .map(|(_, r)| r.unwrap_or(0) as u64)
            .sum();
    }
    if a.json {
        println!(
            "{}",
            json!({
                "nodeId": id.to_string(), "name": device.name, "scope": after,
                "owner": after.is_full(), "changed": changes && after != before, "sessionsEnded": ended,
            })
        );
        return Ok(());
    }
    let words = if after.is_full() { "everything, as the owner".to_string() } else { after.describe() };
    if !changes {
        println!("{label} may do: {words}");
    } else if after == before {
        println!("{label} may do: {words} (unchanged)");
    } else {
        let live = if ended > 0 { format!("; {ended} of its session(s) ended") } else { String::new() };
        println!("{label} may now do: {words} (it was: {}){live}", before.describe());
    }
    if after.expired(now_ms()) {
        println!("Its access has ended: it is refused until you give it more (--for or --no-end).");
    }
    Ok(())
}
