//! Several devices on one session: real bridge processes, real `thunderbolt
//! acp connect` processes for each device (paired with one-time codes, so
//! they are the owner's own devices), a real local relay, and nftables for
//! one device's outage.

use serde_json::{json, Value};
use thunderbolt_shared::devices::{
    METHOD_ANSWERED, METHOD_LEFT, METHOD_MISSED, METHOD_ROLE, OBSERVER_REFUSED_CODE,
};
use thunderbolt_tests::{setup::status, *};

/// One device's `connect`: JSON lines in and out.
type Device = JsonConnect;

/// A second connection of one device at the same time dials directly
/// (`--relay-url disabled`): two endpoints of one NodeId on one relay
/// displace each other (the relay keeps the newest), and the one displaced
/// loses its connection if it was still on the relay path.
const SECOND: &str = "--relay-url";

fn note(n: u64) -> Value {
    json!({"jsonrpc": "2.0", "method": "note", "params": {"sessionId": "s-1", "n": n}})
}

fn is_note(n: u64) -> impl Fn(&Value) -> bool {
    move |v| v["method"] == "note" && v["params"]["n"] == n
}

fn role_of(v: &Value) -> Option<(String, String)> {
    (v["method"] == METHOD_ROLE).then(|| {
        let p = &v["params"];
        (p["role"].as_str().unwrap().to_string(), p["controller"]["name"].as_str().unwrap_or("").to_string())
    })
}

/// `iroh pair` on the bridge's home, `connect --pair` on the device's: the
/// device is one of the owner's own, named `name`.
async fn pair(home: &Tb, device: &Tb, ticket: &str, name: &str) {
    thunderbolt_tests::setup::pair(home, device, ticket, name, &[]).await;
}

/// `thunderbolt sessions <ticket> --json` from `device`.
async fn sessions(device: &Tb, ticket: &str) -> Vec<Value> {
    let out = device.run(&["sessions", ticket, "--json"]).await;
    assert!(out.status.success(), "sessions: {}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["sessions"].as_array().unwrap().clone()
}

/// `thunderbolt kick <what>` on the host; `device`'s connect exits unsuccessfully, saying why.
async fn kick_and_see_it_end(home: &Tb, what: &str, device: &mut Device) {
    let out = home.run(&["kick", what]).await;
    assert!(out.status.success(), "kick: {}", String::from_utf8_lossy(&out.stderr));
    let gone = tokio::time::timeout(WAIT, device.child.wait()).await.expect("kicked device exits").unwrap();
    assert!(!gone.success());
    device.log.wait_for("ended by the host").await;
}

/// The laptop starts a session (one line there and back); the phone finds its id.
async fn laptop_session(laptop: &Tb, phone: &Tb, ticket: &str, flags: &[&str]) -> (Device, String) {
    let mut args = flags.to_vec();
    args.push(ticket);
    let mut l = Device::start(laptop, &args);
    l.send(note(0)).await;
    l.until(is_note(0)).await;
    let id = sessions(phone, ticket).await[0]["id"].as_str().unwrap().to_string();
    (l, id)
}

struct Rig {
    _relay: LocalRelay,
    home: Tb,
    bridge: RunningBridge,
    laptop: Tb,
    phone: Tb,
}

async fn rig(agent: &str) -> Rig {
    rig_with(agent, &[]).await
}

async fn rig_with(agent: &str, flags: &[&str]) -> Rig {
    let relay = LocalRelay::start().await;
    let home = Tb::new(Some(&relay));
    let agent_bin = test_agent_bin();
    let bridge = home.bridge("acp", flags, &[agent_bin.to_str().unwrap(), agent]).await;
    let (laptop, phone) = (Tb::new(Some(&relay)), Tb::new(Some(&relay)));
    pair(&home, &laptop, &bridge.ticket, "laptop").await;
    pair(&home, &phone, &bridge.ticket, "phone").await;
    Rig { _relay: relay, home, bridge, laptop, phone }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_laptops_session_is_picked_up_on_the_phone_and_control_moves_between_them() {
    let Rig { _relay, home, bridge, laptop, phone } = rig("cat").await;
    let ticket = bridge.ticket.as_str();
    let mut l = Device::start(&laptop, &[ticket]);
    l.send(note(0)).await;
    l.until(is_note(0)).await;

    // The phone lists the laptop's session: who started it, the ACP session, who is on it.
    let listed = sessions(&phone, ticket).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    let s = &listed[0];
    assert_eq!(s["startedBy"]["name"], "laptop", "{s}");
    assert_eq!(s["acpSessions"], json!(["s-1"]), "{s}");
    let id = s["id"].as_str().unwrap();
    let since = s["attached"][0]["sinceMs"].clone();
    assert!(since.as_u64().is_some_and(|t| t > 0), "{s}");
    assert_eq!(
        s["attached"],
        json!([{"node": s["startedBy"]["node"], "name": "laptop", "role": "controller", "seat": format!("{id}.0"), "sinceMs": since}])
    );
    let id = s["id"].as_str().unwrap().to_string();

    // It joins as an observer with the whole history: the past frame, its role, then live ones.
    let mut p = Device::start(&phone, &["--attach", &id, "--observe", "--history", "all", ticket]);
    p.until(is_note(0)).await;
    let role = p.until(|v| role_of(v).is_some()).await;
    assert_eq!(role_of(&role), Some(("observer".into(), "laptop".into())));
    p.log.wait_for("this device observes the session").await;
    l.send(note(1)).await;
    p.until(is_note(1)).await;
    l.until(is_note(1)).await;

    // An observer's request is refused with its role named; the agent never sees it.
    p.send(json!({"jsonrpc": "2.0", "id": "p1", "method": "session/prompt", "params": {"sessionId": "s-1"}}))
        .await;
    let refused = p.until(|v| v["id"] == "p1").await;
    assert_eq!(refused["error"]["code"], OBSERVER_REFUSED_CODE, "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("observer"), "{refused}");

    // The phone takes control (a second device of the phone's, joining as controller, from now on).
    let mut pc = Device::start(&phone, &[SECOND, "disabled", "--attach", &id, "--history", "now", ticket]);
    let role = pc.until(|v| role_of(v).is_some()).await;
    assert_eq!(role.get("params").unwrap()["role"], "controller");
    let told = l.until(|v| role_of(v).is_some()).await;
    assert_eq!(role_of(&told), Some(("observer".into(), "phone".into())));
    pc.send(note(2)).await;
    for d in [&mut l, &mut p, &mut pc] {
        // Every device sees it; the observer's refused request never reached the agent.
        let v = d.until(|v| v["method"] == "note" || v["method"] == "session/prompt").await;
        assert!(is_note(2)(&v), "{v}");
    }
    l.send(json!({"jsonrpc": "2.0", "id": 9, "method": "session/prompt", "params": {}})).await;
    assert_eq!(l.until(|v| v["id"] == 9).await["error"]["code"], OBSERVER_REFUSED_CODE);

    // `status` shows every device and its role; kick ends one device's attachment only.
    let st = status(&home).await;
    let devices = st["bridges"][0]["sessions"][0]["devices"].as_array().unwrap().clone();
    let roles: Vec<(String, String)> = devices
        .iter()
        .map(|d| (d["device"].as_str().unwrap_or("").to_string(), d["role"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(
        roles,
        vec![
            ("laptop".to_string(), "observer".to_string()),
            ("phone".to_string(), "observer".to_string()),
            ("phone".to_string(), "controller".to_string())
        ],
        "{st}"
    );
    let observer_id = devices[1]["id"].as_str().unwrap().to_string();
    kick_and_see_it_end(&home, &observer_id, &mut p).await;
    pc.send(note(3)).await;
    l.until(is_note(3)).await;
    pc.until(is_note(3)).await;

    // The laptop closes: the session goes on on the phone, with the same agent.
    let pid = st["bridges"][0]["sessions"][0]["pid"].clone();
    assert!(l.close().await.success());
    bridge.log.wait_for("laptop left the session").await;
    pc.send(note(4)).await;
    pc.until(is_note(4)).await;
    let st = status(&home).await;
    assert_eq!(st["bridges"][0]["sessions"][0]["pid"], pid, "{st}");
    // Its last device closing ends it.
    assert!(pc.close().await.success());
    bridge.log.wait_for("session ended").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_question_goes_to_every_device_and_the_first_answer_wins() {
    let Rig { _relay, home: _home, bridge, laptop, phone } = rig("ask").await;
    let ticket = bridge.ticket.as_str();
    let mut l = Device::start(&laptop, &[ticket]);
    l.send(note(0)).await;
    l.until(|v| v["id"] == "q1").await;
    let id = sessions(&phone, ticket).await[0]["id"].as_str().unwrap().to_string();
    let mut p1 = Device::start(&phone, &["--attach", &id, "--observe", ticket]);
    let mut p2 = Device::start(
        &phone,
        &[SECOND, "disabled", "--attach", &id, "--observe", "--history", "all", ticket],
    );
    // Both joined with the history: the open question is theirs too.
    p1.until(|v| v["id"] == "q1" && v["method"].is_string()).await;
    p2.until(|v| v["id"] == "q1" && v["method"].is_string()).await;
    let answer =
        |who: &str| json!({"jsonrpc": "2.0", "id": "q1", "result": {"content": format!("from {who}")}});
    p1.send(answer("second")).await;
    // The first and third device are told who answered.
    for d in [&mut l, &mut p2] {
        let told = d.until(|v| v["method"] == METHOD_ANSWERED).await;
        assert_eq!(told["params"]["id"], "q1", "{told}");
        assert_eq!(told["params"]["by"]["name"], "phone", "{told}");
    }
    l.log.wait_for("phone answered the agent's request").await;
    // Later answers are dropped: the agent hears exactly one.
    l.send(answer("first")).await;
    p2.send(answer("third")).await;
    bridge.log.wait_for("answered it first").await;
    l.send(note(1)).await;
    l.until(|v| v["id"] == "q2").await;
    l.send(json!({"jsonrpc": "2.0", "id": "q2", "result": {}})).await;
    bridge.log.wait_for_count("agent stderr: answer:", 2).await;
    let log = bridge.log.text();
    let answers: Vec<&str> = log.lines().filter(|l| l.contains("agent stderr: answer:")).collect();
    assert_eq!(answers.len(), 2, "{log}");
    assert!(answers[0].contains("from second"), "{answers:?}");
    assert!(!answers.iter().any(|a| a.contains("from first")), "{answers:?}");
    assert!(!answers.iter().any(|a| a.contains("from third")), "{answers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_accounts_device_sees_and_joins_nothing_of_the_owners_and_revocation_detaches_one_device() {
    let Rig { _relay, home, bridge, laptop, phone } = rig("cat").await;
    let ticket = bridge.ticket.as_str();
    // A friend's device, let in with `iroh allow` (not one of the owner's own).
    let friend = Tb::new(None).with_env("THUNDERBOLT_IROH_RELAY_URL", _relay.url.to_string());
    home.allow(&friend.node_id("acp").await).await;
    let (mut l, id) = laptop_session(&laptop, &phone, ticket, &[]).await;
    assert_eq!(
        sessions(&friend, ticket).await,
        Vec::<Value>::new(),
        "the friend sees nothing of the owner's"
    );
    // Nor can it join by the (stolen) id: to it the session does not exist.
    let f = Device::start(&friend, &["--attach", &id, ticket]);
    let flog = f.log.clone();
    let end = f.close().await;
    assert!(!end.success());
    flog.wait_for("this device may join").await;
    // Its own session it sees; the owner's devices do not.
    let mut fs = Device::start(&friend, &[ticket]);
    fs.send(note(7)).await;
    fs.until(is_note(7)).await;
    let own = sessions(&friend, ticket).await;
    assert_eq!(own.len(), 1, "{own:?}");
    assert_ne!(own[0]["id"], id.as_str());
    assert_eq!(
        sessions(&phone, ticket).await.len(),
        1,
        "the owner's device does not see the friend's session"
    );

    // The phone joins; then it is revoked: it is detached, the laptop goes on.
    let mut p = Device::start(&phone, &["--attach", &id, "--observe", ticket]);
    p.until(|v| role_of(v).is_some()).await;
    let out = home.run(&["iroh", "deny", &phone.node_id("acp").await.to_string()]).await;
    assert!(out.status.success(), "deny: {}", String::from_utf8_lossy(&out.stderr));
    let gone = tokio::time::timeout(WAIT, p.child.wait()).await.expect("revoked device exits").unwrap();
    assert!(!gone.success());
    p.log.wait_for("membership revoked").await;
    l.send(note(1)).await;
    l.until(is_note(1)).await;
    drop(fs);
}

/// 2000 frames while one device is away (its `connect` stopped, as a locked
/// phone's app is, until the bridge took its connection for lost; the other
/// device untouched): each device gets every frame exactly once, in order,
/// the stopped one after it resumed on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_device_gets_every_frame_once_in_order_across_one_devices_outage() {
    const FRAMES: u64 = 2000;
    let Rig { _relay, home: _home, bridge, laptop, phone } = rig_with("cat", &["--idle-timeout", "1"]).await;
    let ticket = bridge.ticket.as_str();
    let (mut l, id) = laptop_session(&laptop, &phone, ticket, &["--idle-timeout", "1"]).await;
    let mut p = Device::start(
        &phone,
        &["--attach", &id, "--observe", "--history", "now", "--idle-timeout", "1", ticket],
    );
    p.until(|v| role_of(v).is_some()).await;
    let phone_pid = p.child.id().unwrap();
    let send = async {
        for n in 1..=FRAMES {
            l.send(note(n)).await;
        }
    };
    let mut got_p = Vec::new();
    let away = async {
        // Mid-stream the phone goes away until the bridge has taken it for lost.
        while got_p.len() < 200 {
            let v = p.next().await;
            if v["method"] == "note" {
                got_p.push(v["params"]["n"].as_u64().unwrap());
            }
        }
        signal(phone_pid, libc::SIGSTOP);
        bridge.log.wait_for("connection lost").await;
        signal(phone_pid, libc::SIGCONT);
    };
    tokio::join!(send, away);
    while got_p.last() != Some(&FRAMES) {
        let v = p.next().await;
        if v["method"] == "note" {
            got_p.push(v["params"]["n"].as_u64().unwrap());
        }
    }
    assert_eq!(got_p, (1..=FRAMES).collect::<Vec<_>>(), "the phone got every frame once, in order");
    let mut got_l = Vec::new();
    while got_l.last() != Some(&FRAMES) {
        let v = l.next().await;
        if v["method"] == "note" {
            got_l.push(v["params"]["n"].as_u64().unwrap());
        }
    }
    assert_eq!(got_l, (1..=FRAMES).collect::<Vec<_>>(), "the laptop got every frame once, in order");
    p.log.wait_for("session resumed").await;
}

/// The controller's input ends while another device is on the session: it
/// exits 0 with everything it was sent, and the other device takes control
/// of the same agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_whose_input_ends_leaves_and_control_passes_to_the_device_still_there() {
    let Rig { _relay, home: _home, bridge, laptop, phone } = rig("cat").await;
    let ticket = bridge.ticket.as_str();
    let (mut l, id) = laptop_session(&laptop, &phone, ticket, &[]).await;
    let mut p = Device::start(&phone, &["--attach", &id, "--observe", "--history", "now", ticket]);
    p.until(|v| role_of(v).is_some()).await;
    for n in 1..=50 {
        l.send(note(n)).await;
    }
    l.until(is_note(50)).await;
    p.until(is_note(50)).await;
    let llog = l.log.clone();
    assert!(l.close().await.success(), "{}", llog.text());
    llog.wait_for("left the session").await;
    let promoted = p.until(|v| role_of(v).is_some()).await;
    assert_eq!(promoted["params"]["role"], "controller", "{promoted}");
    p.send(note(51)).await;
    p.until(is_note(51)).await;
}

/// `kick <device name>` detaches that device from the sessions it joined;
/// the device that started each goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kicking_a_device_by_name_detaches_it_from_the_sessions_it_joined() {
    let Rig { _relay, home, bridge, laptop, phone } = rig("cat").await;
    let ticket = bridge.ticket.as_str();
    let (mut l, id) = laptop_session(&laptop, &phone, ticket, &[]).await;
    let mut p = Device::start(&phone, &["--attach", &id, "--observe", ticket]);
    p.until(|v| role_of(v).is_some()).await;
    kick_and_see_it_end(&home, "phone", &mut p).await;
    // The laptop is told who left, at once.
    let left = l.until(|v| v["method"] == METHOD_LEFT).await;
    assert_eq!(left["params"]["name"], "phone", "{left}");
    assert!(left["params"]["seat"].as_str().is_some_and(|s| s.starts_with(&format!("{id}."))), "{left}");
    assert!(left["params"]["reason"].as_str().is_some_and(|r| !r.is_empty()), "{left}");
    l.send(note(1)).await;
    l.until(is_note(1)).await;
    let st = status(&home).await;
    assert_eq!(st["bridges"][0]["sessions"].as_array().unwrap().len(), 1, "{st}");
}

/// What one device can cost is bounded: a session takes at most
/// `MAX_DEVICES_PER_SESSION` devices and one device at most
/// `MAX_SEATS_PER_DEVICE` seats on it, so one device's abandoned joins cannot
/// take every seat: the join past either cap is refused with a reason while
/// the device's seats are attached, and its oldest detached seat gives way to
/// its new join. The session goes on for those on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_that_joins_again_and_again_is_refused_past_the_cap() {
    // The bridge takes the killed join for lost after this idle timeout. At
    // 1 s, one run on a busy machine (two builds beside it) had a live join
    // never get the note: a second without a packet is within reach of a
    // join starved of CPU, which the bridge may then take for lost too.
    let Rig { _relay, home, bridge, laptop, phone } = rig_with("cat", &["--idle-timeout", "3"]).await;
    let ticket = bridge.ticket.as_str();
    let (mut l, id) = laptop_session(&laptop, &phone, ticket, &[]).await;
    let join = |who: &Tb| Device::start(who, &["--attach", &id, "--observe", "--history", "now", ticket]);
    async fn refused(d: Device) {
        let log = d.log.clone();
        assert!(!d.close().await.success());
        log.wait_for("too many devices").await;
    }
    // The bridge's `MAX_SEATS_PER_DEVICE`: three seats each, all attached.
    let mut joined = Vec::new();
    for who in [&phone, &phone, &phone, &laptop, &laptop] {
        let mut p = join(who);
        p.until(|v| role_of(v).is_some()).await;
        joined.push(p);
    }
    refused(join(&phone)).await;
    refused(join(&laptop)).await;
    bridge.log.wait_for("seats on this session already, all attached").await;
    // A third device takes the last two of the session's eight seats; no more.
    let tablet = Tb::new(Some(&_relay));
    pair(&home, &tablet, ticket, "tablet").await;
    for _ in 0..2 {
        let mut t = join(&tablet);
        t.until(|v| role_of(v).is_some()).await;
        joined.push(t);
    }
    refused(join(&tablet)).await;
    bridge.log.wait_for("devices are on this session already").await;
    // One of the phone's joins is abandoned (its process killed): once the
    // bridge has taken it for lost, the phone's next join takes its place.
    let mut gone = joined.remove(0);
    gone.child.start_kill().unwrap();
    bridge.log.wait_for("connection lost").await;
    let mut again = join(&phone);
    again.until(|v| role_of(v).is_some()).await;
    bridge.log.wait_for("a newer seat of the same device replaces it").await;
    l.send(note(1)).await;
    l.until(is_note(1)).await;
    again.until(is_note(1)).await;
    for p in joined.iter_mut() {
        p.until(is_note(1)).await;
    }
}

/// A hostile observer's requests dressed as answers (an `id` and a `result`
/// or `error` before the `method`, a key given twice, an escaped key) never
/// reach the agent: each line is read whole, not up to the first key that
/// looks like an answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observers_request_dressed_as_an_answer_never_reaches_the_agent() {
    let Rig { _relay, home: _home, bridge, laptop, phone } = rig("cat").await;
    let ticket = bridge.ticket.as_str();
    let (mut l, id) = laptop_session(&laptop, &phone, ticket, &[]).await;
    let mut p = Device::start(&phone, &["--attach", &id, "--observe", "--history", "now", ticket]);
    p.until(|v| role_of(v).is_some()).await;
    let disguised: [&[u8]; 5] = [
        br#"{"jsonrpc":"2.0","id":"x1","result":null,"method":"session/prompt","params":{"sessionId":"s-1"}}"#,
        br#"{"jsonrpc":"2.0","id":"x2","error":{"code":1,"message":"m"},"method":"session/prompt","params":{}}"#,
        br#"{"jsonrpc":"2.0","id":"x3","result":{},"id":"x3","method":"session/prompt"}"#,
        br#"{"jsonrpc":"2.0","id":"x4","result":{},"\u006dethod":"session/prompt"}"#,
        br#"{"jsonrpc":"2.0","method":"session/cancel","result":{},"params":{"sessionId":"s-1"}}"#,
    ];
    for line in disguised {
        p.send_raw(line).await;
    }
    // A plain request after them: its refusal says the lines before it were screened.
    p.send(json!({"jsonrpc": "2.0", "id": "p1", "method": "session/prompt", "params": {}})).await;
    let refused = p.until(|v| v["id"] == "p1").await;
    assert_eq!(refused["error"]["code"], OBSERVER_REFUSED_CODE, "{refused}");
    // The agent echoes what reaches it: the controller's line after all of
    // them comes back alone.
    l.send(note(1)).await;
    l.until(is_note(1)).await;
    let reached: Vec<&Value> =
        l.seen.iter().filter(|v| v.get("id").is_some() || v["method"] == "session/cancel").collect();
    assert!(reached.is_empty(), "the observer's lines reached the agent: {reached:?}");
}

/// An observer answers the agent's question with its id spelled another way
/// (`"\u0071\u0031"` is `"q1"`): ids are compared as values, so the others
/// are told it answered, and a second answer is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_spells_the_id_another_way_is_still_the_first_answer() {
    let Rig { _relay, home: _home, bridge, laptop, phone } = rig("ask").await;
    let ticket = bridge.ticket.as_str();
    let mut l = Device::start(&laptop, &[ticket]);
    l.send(note(0)).await;
    l.until(|v| v["id"] == "q1").await;
    let id = sessions(&phone, ticket).await[0]["id"].as_str().unwrap().to_string();
    let mut p = Device::start(&phone, &["--attach", &id, "--observe", "--history", "all", ticket]);
    p.until(|v| v["id"] == "q1" && v["method"].is_string()).await;
    p.send_raw(br#"{"jsonrpc":"2.0","id":"\u0071\u0031","result":{"content":"from the phone"}}"#).await;
    let told = l.until(|v| v["method"] == METHOD_ANSWERED).await;
    assert_eq!(told["params"]["id"], "q1", "{told}");
    assert_eq!(told["params"]["by"]["name"], "phone", "{told}");
    l.send(json!({"jsonrpc": "2.0", "id": "q1", "result": {"content": "from the laptop"}})).await;
    bridge.log.wait_for("answered it first").await;
}

/// A device that watches and stops reading (a locked phone, a stopped
/// process) never holds the agent: the controller's long turn streams on at
/// full speed, and the observer, when it reads again, is told how much it
/// missed and gets the session's frames from there on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_observer_never_holds_the_agent_and_is_told_what_it_missed() {
    // 8 MiB through a 1 MiB resume buffer, with a grace far longer than the test.
    const FRAMES: u64 = 512;
    let flags = ["--resume-buffer", "1M", "--resume-grace", "600"];
    let Rig { _relay, home: _home, bridge, laptop, phone } = rig_with("cat", &flags).await;
    let ticket = bridge.ticket.as_str();
    let (mut l, id) = laptop_session(&laptop, &phone, ticket, &[]).await;
    let mut p = Device::start(&phone, &["--attach", &id, "--observe", "--history", "now", ticket]);
    p.until(|v| role_of(v).is_some()).await;
    let phone_pid = p.child.id().unwrap();
    signal(phone_pid, libc::SIGSTOP);
    let pad = "x".repeat(16 * 1024);
    for n in 1..=FRAMES {
        l.send(json!({"jsonrpc": "2.0", "method": "note", "params": {"n": n, "pad": pad}})).await;
        l.until(is_note(n)).await;
    }
    signal(phone_pid, libc::SIGCONT);
    let missed = p.until(|v| v["method"] == METHOD_MISSED).await;
    assert!(missed["params"]["frames"].as_u64().unwrap() > 0, "{missed}");
    assert!(missed["params"]["bytes"].as_u64().unwrap() > 1 << 20, "{missed}");
    p.log.wait_for("this device fell behind the session").await;
    // From there on it gets the session's frames again.
    l.send(note(FRAMES + 1)).await;
    l.until(is_note(FRAMES + 1)).await;
    p.until(is_note(FRAMES + 1)).await;
    let notes: Vec<u64> =
        p.seen.iter().filter(|v| v["method"] == "note").map(|v| v["params"]["n"].as_u64().unwrap()).collect();
    assert!(notes.windows(2).all(|w| w[0] < w[1]), "frames once and in order: {notes:?}");
    assert!((notes.len() as u64) < FRAMES, "the observer cannot have had them all: {}", notes.len());
}

/// The device that started a session leaves (its input ends) while another
/// controls it: the session stays joinable, by the device that left and by
/// a second connection of the one in control.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_stays_joinable_after_the_device_that_started_it_leaves() {
    let Rig { _relay, home: _home, bridge, laptop, phone } = rig("cat").await;
    let ticket = bridge.ticket.as_str();
    let (l, id) = laptop_session(&laptop, &phone, ticket, &[]).await;
    let mut p = Device::start(&phone, &["--attach", &id, "--history", "now", ticket]);
    p.until(|v| role_of(v).is_some()).await;
    let llog = l.log.clone();
    assert!(l.close().await.success(), "{}", llog.text());
    llog.wait_for("left the session").await;
    p.send(note(1)).await;
    p.until(is_note(1)).await;
    // The laptop comes back, to watch; the phone opens a second connection.
    let mut l2 = Device::start(&laptop, &["--attach", &id, "--observe", "--history", "now", ticket]);
    let role = l2.until(|v| role_of(v).is_some()).await;
    assert_eq!(role_of(&role), Some(("observer".into(), "phone".into())), "{role}");
    let mut p2 = Device::start(
        &phone,
        &[SECOND, "disabled", "--attach", &id, "--observe", "--history", "now", ticket],
    );
    p2.until(|v| role_of(v).is_some()).await;
    p.send(note(2)).await;
    for d in [&mut p, &mut l2, &mut p2] {
        d.until(is_note(2)).await;
    }
}

/// The controller that joined leaves while the device that started the
/// session is still attached: that device takes control (it is the earliest
/// attached), is told so, and its requests reach the agent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_controller_leaves_the_device_still_attached_takes_control() {
    let Rig { _relay, home: _home, bridge, laptop, phone } = rig("cat").await;
    let ticket = bridge.ticket.as_str();
    let (mut l, id) = laptop_session(&laptop, &phone, ticket, &[]).await;
    let p = Device::start(&phone, &["--attach", &id, "--history", "now", ticket]);
    let told = l.until(|v| role_of(v).is_some()).await;
    assert_eq!(role_of(&told), Some(("observer".into(), "phone".into())));
    let plog = p.log.clone();
    assert!(p.close().await.success(), "{}", plog.text());
    let promoted = l.until(|v| role_of(v).is_some()).await;
    assert_eq!(promoted["params"]["role"], "controller", "{promoted}");
    l.send(json!({"jsonrpc": "2.0", "id": 5, "method": "session/prompt", "params": {"sessionId": "s-1"}}))
        .await;
    let back = l.until(|v| v["id"] == 5).await;
    assert_eq!(back["method"], "session/prompt", "the agent got the request (cat echoes it): {back}");
}

/// Every device gets only the answers to its own requests: two clients
/// number their requests alike (from 0), so another device's answer would be
/// taken for its own. A joining device's history holds none; a request whose
/// id another device's request in flight has is refused, not mixed up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_device_gets_only_the_answers_to_its_own_requests() {
    use thunderbolt_shared::devices::ID_IN_USE_CODE;
    let later = |id: u64, n: u64| {
        json!({"jsonrpc": "2.0", "id": id, "method": "later",
               "params": {"ms": 0, "send": [{"jsonrpc": "2.0", "method": "note", "params": {"n": n}}]}})
    };
    let answers_to =
        |d: &Device, id: u64| d.seen.iter().filter(|v| v["id"] == id && v.get("result").is_some()).count();
    let Rig { _relay, home: _home, bridge, laptop, phone } = rig("later").await;
    let ticket = bridge.ticket.as_str();
    let mut l = Device::start(&laptop, &[ticket]);
    // A request the agent never answers stays in flight; then request 0.
    l.send(json!({"jsonrpc": "2.0", "id": 9, "method": "unanswered"})).await;
    l.send(later(0, 1)).await;
    l.until(is_note(1)).await;
    assert_eq!(answers_to(&l, 0), 1);
    let id = sessions(&phone, ticket).await[0]["id"].as_str().unwrap().to_string();

    // The phone takes control with the whole history: the note, not the laptop's answer.
    let mut p = Device::start(&phone, &["--attach", &id, "--history", "all", ticket]);
    p.until(|v| role_of(v).is_some()).await;
    assert!(p.seen.iter().any(is_note(1)), "{:?}", p.seen);
    assert_eq!(answers_to(&p, 0), 0, "the laptop's answer was in the phone's history: {:?}", p.seen);
    // Its own request 0: its answer, to it alone.
    p.send(later(0, 2)).await;
    p.until(is_note(2)).await;
    l.until(is_note(2)).await;
    assert_eq!(answers_to(&p, 0), 1, "{:?}", p.seen);
    assert_eq!(answers_to(&l, 0), 1, "the phone's answer reached the laptop: {:?}", l.seen);
    // Request 9 is the laptop's, still in flight: the phone's 9 is refused.
    p.send(later(9, 3)).await;
    let refused = p.until(|v| v["id"] == 9).await;
    assert_eq!(refused["error"]["code"], ID_IN_USE_CODE, "{refused}");
    p.send(later(10, 4)).await;
    p.until(is_note(4)).await;
    assert!(!p.seen.iter().any(is_note(3)), "the refused request reached the agent");
}

/// A device that watches sees the whole turn another device started: the
/// prompt, with what it asked and who asked it, then that the turn ended and
/// how; the answer itself goes only to the device that asked. The device that
/// asked is told neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watching_device_is_told_of_the_prompt_another_sent_and_of_its_turns_end() {
    use thunderbolt_shared::devices::{METHOD_PROMPTED, METHOD_TURN_ENDED};
    let Rig { _relay, home: _home, bridge, laptop, phone } = rig("respond").await;
    let ticket = bridge.ticket.as_str();
    let mut l = Device::start(&laptop, &[ticket]);
    l.send(json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}})).await;
    l.until(|v| v["id"] == 0).await;
    let id = sessions(&phone, ticket).await[0]["id"].as_str().unwrap().to_string();
    let mut p = Device::start(&phone, &["--attach", &id, "--observe", ticket]);
    p.until(|v| role_of(v).is_some()).await;

    let prompt = json!([{"type": "text", "text": "fix the build"}]);
    l.send(json!({"jsonrpc": "2.0", "id": 1, "method": "session/prompt",
                  "params": {"sessionId": "s-1", "prompt": prompt}}))
        .await;
    let answer = l.until(|v| v["id"] == 1).await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let told = p.until(|v| v["method"] == METHOD_PROMPTED).await;
    assert_eq!(told["params"]["by"]["name"], "laptop", "{told}");
    assert_eq!(told["params"]["id"], 1, "{told}");
    assert_eq!(told["params"]["prompt"], prompt, "{told}");
    let ended = p.until(|v| v["method"] == METHOD_TURN_ENDED).await;
    assert_eq!(ended["params"]["stopReason"], "end_turn", "{ended}");
    assert_eq!(ended["params"]["by"]["name"], "laptop", "{ended}");
    p.log.wait_for("the turn laptop started (its request 1) ended: end_turn").await;
    assert!(!p.seen.iter().any(|v| v["id"] == 1), "the laptop's answer reached the phone: {:?}", p.seen);
    // The laptop hears of neither: it asked.
    l.send(json!({"jsonrpc": "2.0", "id": 2, "method": "x"})).await;
    l.until(|v| v["id"] == 2).await;
    assert!(
        !l.seen.iter().any(|v| v["method"] == METHOD_PROMPTED || v["method"] == METHOD_TURN_ENDED),
        "{:?}",
        l.seen
    );
}

/// A client written only against ACP's multi-client proposal (PR #533)
/// joins a shared session (the transport's join, then `session/attach` with
/// its own `clientId`) and sees `prompt_received` and `permission_resolved`
/// naming the laptop's client id and the request's ids, and
/// `client_disconnected` when the laptop goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_of_the_multi_client_proposal_sees_who_prompted_and_who_answered() {
    let Rig { _relay, home: _home, bridge, laptop, phone } = rig("cat").await;
    let ticket = bridge.ticket.as_str();
    let (mut l, id) = laptop_session(&laptop, &phone, ticket, &[]).await;
    let mut p = Device::start(&phone, &["--attach", &id, "--observe", "--history", "now", ticket]);
    p.until(|v| role_of(v).is_some()).await;
    p.send(json!({"jsonrpc": "2.0", "id": "a1", "method": "session/attach",
                  "params": {"sessionId": "s-1", "clientId": "d290f1ee-phone", "historyPolicy": "none",
                             "clientInfo": {"name": "mc-test", "version": "1"}}}))
        .await;
    let attached = p.until(|v| v["id"] == "a1").await;
    assert_eq!(attached["result"]["clientId"], "d290f1ee-phone", "{attached}");
    assert_eq!(attached["result"]["sessionId"], "s-1");
    let laptop_client = format!("{id}.0");
    let connected: Vec<&str> = attached["result"]["connectedClients"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["clientId"].as_str().unwrap())
        .collect();
    assert_eq!(connected, vec![laptop_client.as_str(), "d290f1ee-phone"], "{attached}");

    let update = |kind: &'static str| {
        move |v: &Value| v["method"] == "session/update" && v["params"]["update"]["type"] == kind
    };
    l.send(json!({"jsonrpc": "2.0", "id": 5, "method": "session/prompt",
                  "params": {"sessionId": "s-1", "prompt": [{"type": "text", "text": "deploy it"}]}}))
        .await;
    let told = p.until(update("prompt_received")).await;
    let u = &told["params"]["update"];
    assert_eq!(told["params"]["sessionId"], "s-1");
    assert_eq!(u["sentBy"]["clientId"], laptop_client.as_str(), "{told}");
    assert_eq!(u["sentBy"]["name"], "laptop");
    assert_eq!(u["requestId"], 5);
    assert_eq!(u["prompt"][0]["text"], "deploy it");

    // The agent (`cat`) asks what the laptop wrote: a permission request, to every device.
    let asked = json!({"jsonrpc": "2.0", "id": "perm-1", "method": "session/request_permission",
                       "params": {"sessionId": "s-1", "toolCall": {"toolCallId": "call_xyz"}, "options": []}});
    l.send(asked.clone()).await;
    p.until(|v| v["id"] == "perm-1" && v["method"].is_string()).await;
    l.until(|v| v["id"] == "perm-1" && v["method"].is_string()).await;
    l.send(json!({"jsonrpc": "2.0", "id": "perm-1", "result": {"outcome": {"outcome": "selected", "optionId": "allow_once"}}}))
        .await;
    let resolved = p.until(update("permission_resolved")).await;
    let u = &resolved["params"]["update"];
    assert_eq!(u["toolCallId"], "call_xyz", "{resolved}");
    assert_eq!(u["chosenOptionId"], "allow_once");
    assert_eq!(u["requestId"], "perm-1");
    assert_eq!(u["resolvedBy"]["clientId"], laptop_client.as_str());
    assert_eq!(u["sessionUpdate"], "permission_resolved", "ACP's own discriminator too");

    // The laptop leaves: the phone is told which client went.
    assert!(l.close().await.success());
    let gone = p.until(update("client_disconnected")).await;
    assert_eq!(gone["params"]["update"]["client"]["clientId"], laptop_client.as_str(), "{gone}");
    assert!(gone["params"]["update"]["timestamp"].as_str().unwrap().ends_with('Z'));
    let _ = p.close().await;
}

/// A device that joins "from now on" while the agent waits on a question
/// still gets that question (not the one answered before it), and can
/// answer it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_joining_from_now_on_still_gets_the_agents_open_question() {
    let Rig { _relay, home: _home, bridge, laptop, phone } = rig("ask").await;
    let ticket = bridge.ticket.as_str();
    let mut l = Device::start(&laptop, &[ticket]);
    l.send(note(0)).await;
    l.until(|v| v["id"] == "q1").await;
    l.send(json!({"jsonrpc": "2.0", "id": "q1", "result": {"content": "from the laptop"}})).await;
    bridge.log.wait_for("agent stderr: answer:").await;
    l.send(note(1)).await;
    l.until(|v| v["id"] == "q2").await;
    let id = sessions(&phone, ticket).await[0]["id"].as_str().unwrap().to_string();
    let mut p = Device::start(&phone, &["--attach", &id, "--history", "now", ticket]);
    let asked = p.until(|v| v["id"] == "q2").await;
    assert!(asked["method"].is_string(), "the question itself: {asked}");
    assert!(!p.seen.iter().any(|v| v["id"] == "q1"), "a question answered before the join: {:?}", p.seen);
    p.send(json!({"jsonrpc": "2.0", "id": "q2", "result": {"content": "from the phone"}})).await;
    bridge.log.wait_for_count("agent stderr: answer:", 2).await;
    assert!(bridge.log.text().contains("from the phone"), "{}", bridge.log.text());
    drop(l);
}
