//! Keeping an endpoint homed on a relay that answers: a dead home relay is
//! set aside at once, and given back when it answers again.

use std::time::Duration;

use iroh::{Endpoint, RelayMode, RelayUrl, Watcher};
use tracing::debug;

use super::{Answer, RelayCheck, Relays, RELAY_CHECK_EVERY};

/// `THUNDERBOLT_RELAY_FAILOVER=off`: iroh is left to notice a dead relay by
/// itself (its periodic re-check; the idle timeout for a connection through
/// it). For measuring what the failover gains (the bench), not for use.
pub fn failover_off() -> bool {
    std::env::var("THUNDERBOLT_RELAY_FAILOVER").is_ok_and(|v| v == "off")
}

/// How often an endpoint whose home relay is gone is made to look for
/// another. iroh looks again by itself only at its periodic re-check (every
/// 20–26 s): for that long nobody reaches the bridge through a relay, a
/// browser not at all (n0-computer/iroh#4319). A relay map change makes it
/// run its report at once, which homes the endpoint on the nearest relay that
/// answers.
pub const REHOME_EVERY: Duration = Duration::from_secs(1);

/// ... doubling while none answers, up to this (offline, iroh's report is not
/// run every second for as long as it lasts).
pub const REHOME_MAX: Duration = Duration::from_secs(30);

/// How often a relay set aside as gone is asked whether it answers again
/// (then it is given back to the endpoint); at once when the home relay is
/// lost and no other is left.
pub const REVIVE_EVERY: Duration = Duration::from_secs(1);

/// Keeps `ep` homed on a relay that answers, while it has relays of its own
/// to choose from. The home relay is asked every [`RELAY_CHECK_EVERY`]
/// whether it answers ([`RelayCheck`]): iroh itself notices a relay that
/// refuses at once but one that went silent only at its ping's timeout. A
/// home relay that is gone either way is set aside: taken off the
/// endpoint's relay map, which makes iroh run its report at once, without
/// waiting for the dead one's probes, and home on one that answers (about
/// 0.2 s). It is given back once it answers again ([`REVIVE_EVERY`]). The
/// last relay is never taken off: when none answers, iroh is made to look
/// again every [`REHOME_EVERY`], doubling to [`REHOME_MAX`]. Runs until the
/// endpoint closes.
pub async fn keep_a_home_relay(ep: Endpoint, relays: Relays) {
    use futures::StreamExt;
    if failover_off() {
        return;
    }
    let Relays::Custom(urls) = &relays else { return };
    if urls.len() < 2 {
        return;
    }
    let map = RelayMode::custom(urls.iter().cloned()).relay_map();
    let check = RelayCheck::new(&ep);
    let mut statuses = ep.home_relay_status().stream();
    // The home relay iroh holds connected.
    let mut home: Option<RelayUrl> = None;
    // Relays taken off the endpoint's map, and when they are asked again.
    let mut aside: Vec<RelayUrl> = Vec::new();
    let mut revive_at = tokio::time::Instant::now();
    // Homeless since, and when to make iroh look again.
    let mut lost: Option<(RelayUrl, tokio::time::Instant)> = None;
    let mut gap = REHOME_EVERY;
    let mut tick = tokio::time::interval(RELAY_CHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // One check of the home relay at a time, and one of those set aside.
    let mut ping: Option<futures::future::BoxFuture<'static, (RelayUrl, Answer)>> = None;
    let mut revive: Option<futures::future::BoxFuture<'static, Vec<(RelayUrl, Answer)>>> = None;
    loop {
        let retry = lost.as_ref().map(|(_, at)| *at);
        // A home relay that is gone, and why.
        let mut gone: Option<(RelayUrl, String)> = None;
        tokio::select! {
            s = statuses.next() => {
                let Some(list) = s else { return };
                match list.first() {
                    Some(now) if now.is_connected() => {
                        gap = REHOME_EVERY;
                        if home.as_ref() != Some(now.url()) {
                            debug!("home relay {}: connected", now.url());
                            home = Some(now.url().clone());
                            ping = None;
                        }
                        if let Some((old, _)) = lost.take() {
                            if old != *now.url() {
                                tracing::info!("relay {old} lost: re-homed on {}", now.url());
                            }
                        }
                    }
                    Some(now) => {
                        if home.take().is_some() {
                            let why = now.last_error().map(|e| format!("{e:#}")).unwrap_or_default();
                            gone = Some((now.url().clone(), why));
                        } else if lost.is_none() {
                            // Not (yet) connected: looked at again if it stays so.
                            lost = Some((now.url().clone(), tokio::time::Instant::now() + gap));
                        }
                    }
                    None => {
                        if let Some(url) = home.take() {
                            gone = Some((url, "no home relay".into()));
                        }
                    }
                }
            }
            _ = tick.tick(), if (ping.is_none() && home.is_some()) || (revive.is_none() && !aside.is_empty()) => {
                if let (None, Some(url)) = (&ping, home.clone()) {
                    let check = check.clone();
                    ping = Some(Box::pin(async move {
                        let answer = check.ping(&url).await;
                        (url, answer)
                    }));
                }
                if revive.is_none() && !aside.is_empty() && tokio::time::Instant::now() >= revive_at {
                    revive_at = tokio::time::Instant::now() + REVIVE_EVERY;
                    revive = Some(ask_again(&check, &aside));
                }
            }
            (url, answer) = async { ping.as_mut().expect("set").await }, if ping.is_some() => {
                ping = None;
                if let Answer::Refused(why) | Answer::Silent(why) = answer {
                    if home.as_ref() == Some(&url) {
                        home = None;
                        gone = Some((url, why));
                    }
                }
            }
            answers = async { revive.as_mut().expect("set").await }, if revive.is_some() => {
                revive = None;
                for (url, answer) in answers {
                    if answer == Answer::Alive && aside.contains(&url) {
                        tracing::info!("relay {url} answers again");
                        aside.retain(|u| *u != url);
                        if let Some(cfg) = map.get(&url) {
                            ep.insert_relay(url, cfg).await;
                        }
                    }
                }
            }
            _ = async { tokio::time::sleep_until(retry.expect("set")).await }, if retry.is_some() => {
                let Some((url, at)) = lost.as_mut() else { continue };
                debug!("home relay {url} lost: looking for another");
                // Re-inserting a relay's own configuration changes nothing but
                // makes iroh report (and choose a home) now.
                let again = urls.iter().find(|u| !aside.contains(u)).unwrap_or(url);
                if let Some(cfg) = map.get(again) {
                    ep.insert_relay(again.clone(), cfg).await;
                }
                *at = tokio::time::Instant::now() + gap;
                gap = (gap * 2).min(REHOME_MAX);
            }
            _ = ep.closed() => return,
        }
        let Some((url, why)) = gone else { continue };
        let others = urls.iter().any(|u| *u != url && !aside.contains(u));
        if others && !aside.contains(&url) {
            debug!("home relay {url} gone ({why}): set aside until it answers again");
            aside.push(url.clone());
            revive_at = tokio::time::Instant::now() + REVIVE_EVERY;
            // Taken off the map: iroh reports at once, without the dead one.
            ep.remove_relay(&url).await;
            lost.get_or_insert((url, tokio::time::Instant::now() + gap));
        } else if !aside.is_empty() {
            // None other left on the map: one set aside may answer again by
            // now (given back, it makes iroh report); else iroh looks again.
            debug!("home relay {url} gone ({why}): asking those set aside again");
            if revive.is_none() {
                revive_at = tokio::time::Instant::now() + REVIVE_EVERY;
                revive = Some(ask_again(&check, &aside));
            }
            lost.get_or_insert((url, tokio::time::Instant::now() + gap));
        } else {
            debug!("home relay {url} gone ({why}): looking for another");
            lost = Some((url, tokio::time::Instant::now()));
        }
    }
}

/// Asks each of `urls` whether it answers.
fn ask_again(
    check: &RelayCheck,
    urls: &[RelayUrl],
) -> futures::future::BoxFuture<'static, Vec<(RelayUrl, Answer)>> {
    let (check, urls) = (check.clone(), urls.to_vec());
    Box::pin(async move {
        // Asked afresh: a refusal another check saw just before it came back is stale.
        let answers = futures::future::join_all(urls.iter().map(|u| check.ask(u))).await;
        urls.into_iter().zip(answers).collect()
    })
}
