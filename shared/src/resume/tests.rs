//! The wire pieces of `/r1` on their own: control lines, framing, the
//! replay log, ack counts.

use bytes::Bytes;

use super::*;

fn events(r: &mut Receiver, data: &[u8]) -> Vec<Event> {
    r.push(data);
    let mut out = Vec::new();
    r.drain(&mut out);
    out
}

#[test]
fn control_lines_round_trip() {
    for c in [
        Control::Hello { session: None, received: 0 },
        Control::Hello { session: Some("ab12".into()), received: 7 },
        Control::Welcome { session: "ab12".into(), received: 3, grace_ms: 300_000 },
        Control::Ack(128),
        Control::Eof(9),
        Control::End(10),
    ] {
        let line = c.encode();
        assert_eq!(line[0], b'!');
        assert_eq!(*line.last().unwrap(), b'\n');
        assert_eq!(Control::parse(&line), Ok(Some(c)));
    }
    assert_eq!(Control::parse(b"!{\"future\":1}"), Ok(None), "unknown kinds are ignored");
    assert_eq!(
        Control::parse(b"!{\"ack\":3,\"extra\":true}"),
        Ok(Some(Control::Ack(3))),
        "unknown fields too"
    );
}

#[test]
fn control_lines_that_break_the_protocol_are_refused_alike() {
    let bad = |l: &[u8]| Control::parse(l).unwrap_err();
    assert_eq!(bad(b"!not json"), BadControl::NotAnObject);
    assert_eq!(bad(b"![1]"), BadControl::NotAnObject);
    assert_eq!(bad(b"!{\"hello\":99,\"session\":null,\"received\":0}"), BadControl::Version);
    assert_eq!(bad(b"!{\"hello\":\"1\",\"session\":null,\"received\":0}"), BadControl::Version);
    assert_eq!(bad(b"!{\"hello\":1,\"session\":7,\"received\":0}"), BadControl::NotASession);
    assert_eq!(bad(b"!{\"hello\":1,\"session\":null}"), BadControl::Missing("received"));
    // Every number that is not a u64 is refused the same way, on the fast path and off it.
    for n in ["18446744073709551616", "99999999999999999999", "-1", "5.0", "1e3", "\"5\"", "null", "007"] {
        for line in [format!("!{{\"ack\":{n}}}"), format!("!{{ \"ack\": {n} }}")] {
            let got = Control::parse(line.as_bytes());
            assert!(
                matches!(got, Err(BadControl::NotACount("ack")) | Err(BadControl::NotAnObject)),
                "{line}: {got:?}"
            );
        }
        assert!(Control::parse(format!("!{{\"eof\":{n}}}").as_bytes()).is_err(), "eof {n}");
    }
    assert_eq!(Control::parse(b"!{\"ack\":18446744073709551615}"), Ok(Some(Control::Ack(u64::MAX))));
    assert_eq!(Control::parse(b"!{\"ack\":0}"), Ok(Some(Control::Ack(0))));
    assert_eq!(bad(b"!{\"end\":-1}"), BadControl::NotACount("end"));
    assert_eq!(bad(b"!{\"session\":\"ab\",\"received\":1.5}"), BadControl::NotACount("received"));
}

#[test]
fn control_lines_end_within_the_limit_however_they_arrive() {
    assert_eq!(control_line_end(b"!{}\nmore"), Ok(Some(3)));
    assert_eq!(control_line_end(b"!{\"hello\""), Ok(None));
    let long = vec![b' '; MAX_CONTROL_LINE];
    assert_eq!(control_line_end(&long), Err(LineTooLong), "no room left for a line end");
    let mut one_write = vec![b' '; 1549];
    one_write.push(b'\n');
    assert_eq!(control_line_end(&one_write), Err(LineTooLong), "a long line in one piece");
    assert_eq!(control_line_end(&one_write[..700]), Ok(None));
    let mut fits = vec![b' '; MAX_CONTROL_LINE - 1];
    fits.push(b'\n');
    assert_eq!(control_line_end(&fits), Ok(Some(MAX_CONTROL_LINE - 1)));
}

#[test]
fn receiver_separates_frames_and_controls() {
    let mut r = Receiver::new(1024);
    let got = events(&mut r, b"{\"a\":1}\n{\"b\":2}\n!{\"ack\":5}\n{\"c\":");
    assert_eq!(
        got,
        vec![
            Event::Data { bytes: Bytes::from_static(b"{\"a\":1}\n{\"b\":2}\n"), frames: 2 },
            Event::Control(Some(Control::Ack(5))),
        ]
    );
    assert_eq!(r.buffered(), 5, "the unfinished frame is held back");
    let got = events(&mut r, b"3}\n");
    assert_eq!(got, vec![Event::Data { bytes: Bytes::from_static(b"{\"c\":3}\n"), frames: 1 }]);
    r.push(b"{\"d\":");
    r.reset();
    assert_eq!(events(&mut r, b"!{\"end\":3}\n"), vec![Event::Control(Some(Control::End(3)))]);
    assert_eq!(events(&mut r, b"!{\"ack\":-1}\n"), vec![Event::BadControl(BadControl::NotACount("ack"))]);
}

#[test]
fn control_lines_are_told_from_frames_by_where_the_prefix_is() {
    let mut r = Receiver::new(4096);
    let long_bang = format!("!{}\n", "x".repeat(MAX_CONTROL_LINE));
    let input = [
        &b"!{\"ack\":1}\n{\"t\":\"wow!\"}\n{\"u\":\"!!\"}\n!{\"ack\":2}\n!{\"ack\":3}\n"[..],
        long_bang.as_bytes(),
        b"{\"v\":1}\n!{\"ack\":4}\n!{\"ack\"",
    ]
    .concat();
    let got = events(&mut r, &input);
    let frames = |b: &[u8], n| Event::Data { bytes: Bytes::copy_from_slice(b), frames: n };
    assert_eq!(
        got,
        vec![
            Event::Control(Some(Control::Ack(1))),
            frames(b"{\"t\":\"wow!\"}\n{\"u\":\"!!\"}\n", 2),
            Event::Control(Some(Control::Ack(2))),
            Event::Control(Some(Control::Ack(3))),
            frames(&[long_bang.as_bytes(), b"{\"v\":1}\n"].concat(), 2),
            Event::Control(Some(Control::Ack(4))),
        ]
    );
    assert_eq!(r.buffered(), 7, "the unfinished control line is held back");
    let mut p = Receiver::plain(4096);
    assert_eq!(events(&mut p, b"!{\"ack\":1}\n"), vec![frames(b"!{\"ack\":1}\n", 1)]);
}

#[test]
fn a_frame_over_the_cap_passes_in_pieces_and_counts_once() {
    let mut r = Receiver::new(1024);
    let big = vec![b'x'; 3000];
    let got = events(&mut r, &big);
    assert!(matches!(&got[..], [Event::Data { frames: 0, .. }]));
    let got = events(&mut r, b"x\n{}\n");
    assert_eq!(
        got,
        vec![
            Event::Data { bytes: Bytes::from_static(b"x\n"), frames: 1 },
            Event::Data { bytes: Bytes::from_static(b"{}\n"), frames: 1 }
        ]
    );
}

#[test]
fn replay_log_resends_from_any_point_and_acks_free_memory() {
    let mut log = ReplayLog::new();
    assert_eq!(log.push(Bytes::from_static(b"0\n1\n2\n")), 3);
    assert_eq!(log.push(Bytes::from_static(b"3\n")), 1);
    assert_eq!(log.push(Bytes::from_static(b"4\n5\n")), 2);
    assert_eq!(log.total(), 6);
    assert_eq!(log.since(2).unwrap().concat(), b"2\n3\n4\n5\n");
    log.ack(1).unwrap();
    assert_eq!(log.bytes(), 10);
    assert_eq!(log.since(1).unwrap().concat(), b"1\n2\n3\n4\n5\n");
    log.ack(4).unwrap();
    assert_eq!(log.since(4).unwrap().concat(), b"4\n5\n");
    assert_eq!(log.since(6).unwrap(), Vec::<Bytes>::new());
    assert!(log.since(3).is_err(), "acked frames are gone");
    assert!(log.ack(7).is_err(), "never sent");
    log.ack(6).unwrap();
    assert_eq!(log.bytes(), 0);
}

#[test]
fn a_range_of_the_log_is_cut_at_both_ends() {
    let mut log = ReplayLog::new();
    log.push(Bytes::from_static(b"0\n1\n2\n"));
    log.push(Bytes::from_static(b"3\n"));
    log.push(Bytes::from_static(b"4\n5\n"));
    assert_eq!(log.range(0, 6).unwrap().concat(), b"0\n1\n2\n3\n4\n5\n");
    assert_eq!(log.range(1, 2).unwrap().concat(), b"1\n");
    assert_eq!(log.range(2, 5).unwrap().concat(), b"2\n3\n4\n");
    assert_eq!(log.range(0, 4).unwrap().concat(), b"0\n1\n2\n3\n");
    assert_eq!(log.range(3, 3).unwrap(), Vec::<Bytes>::new());
    assert!(log.range(0, 7).is_err(), "never sent");
    log.ack(2).unwrap();
    assert_eq!(log.range(2, 4).unwrap().concat(), b"2\n3\n");
    assert!(log.range(1, 4).is_err(), "acked frames are gone");
}

#[test]
fn a_turn_takes_whole_runs_up_to_its_bytes() {
    let mut log = ReplayLog::new();
    log.push(Bytes::from_static(b"0\n1\n2\n"));
    log.push(Bytes::from_static(b"3\n"));
    log.push(Bytes::from_static(b"4\n5\n"));
    let (runs, next) = log.next_runs(0, 1).unwrap();
    assert_eq!((runs.concat(), next), (b"0\n1\n2\n".to_vec(), 3), "at least one run");
    let (runs, next) = log.next_runs(1, 5).unwrap();
    assert_eq!((runs.concat(), next), (b"1\n2\n3\n".to_vec(), 4), "from mid-run, until the bytes");
    let (runs, next) = log.next_runs(4, 100).unwrap();
    assert_eq!((runs.concat(), next), (b"4\n5\n".to_vec(), 6));
    let (runs, next) = log.next_runs(6, 100).unwrap();
    assert_eq!((runs, next), (Vec::new(), 6), "nothing after the end");
    log.ack(5).unwrap();
    assert_eq!(log.next_runs(5, 1).unwrap().0.concat(), b"5\n");
    assert!(log.next_runs(4, 1).is_err(), "acked frames are gone");
    // Bytes pushed before a frame: 12 pushed in all, "5\n" after frame 5.
    assert_eq!(
        (log.pushed_bytes(), log.pushed_before(5).unwrap(), log.pushed_before(6).unwrap()),
        (12, 10, 12)
    );
}

#[test]
fn a_log_is_renumbered_where_its_client_stands() {
    let mut log = ReplayLog::starting_at(10);
    log.push(Bytes::from_static(b"old\n"));
    log.push(Bytes::from_static(b"new1\nnew2\n"));
    log.rebase(11, 40).unwrap();
    assert_eq!((log.acked(), log.total()), (40, 42));
    assert_eq!(log.since(40).unwrap().concat(), b"new1\nnew2\n");
    assert!(log.rebase(41, 40).is_err(), "never backwards");
    assert!(log.rebase(40, u64::MAX).is_err(), "no overflow");
}

#[test]
fn local_lines_never_read_as_control() {
    assert_eq!(escape_run(Bytes::from_static(b"{}\n")), Bytes::from_static(b"{}\n"));
    assert_eq!(escape_run(Bytes::from_static(b"!x\n{}\n!y\n")), Bytes::from_static(b" !x\n{}\n !y\n"));
    assert_eq!(escape_counted(Bytes::from_static(b"{}\n{}\n")), (Bytes::from_static(b"{}\n{}\n"), 2));
    assert_eq!(
        escape_counted(Bytes::from_static(b"!x\n{}\n!y\n")),
        (Bytes::from_static(b" !x\n{}\n !y\n"), 3)
    );
    // The last line's newline is its own: nothing after it is a line.
    assert_eq!(escape_counted(Bytes::from_static(b"{}\n!")).1, 1);
}

#[test]
fn acks_are_due_by_count_or_bytes() {
    let mut p = AckPolicy::at(10);
    assert!(!p.took(1, 10));
    assert!(p.pending());
    assert_eq!(p.ack(), Some(Control::Ack(11)));
    assert!(p.took(ACK_EVERY_FRAMES, 10));
    assert!(p.ack().is_some());
    assert!(p.took(1, ACK_EVERY_BYTES as usize));
    assert_eq!(p.ack(), Some(Control::Ack(10 + 2 + ACK_EVERY_FRAMES)));
    assert_eq!(p.ack(), None);
}

mod devices {
    use super::*;
    use crate::devices::{History, Role};

    #[test]
    fn join_list_and_role_lines_read_back() {
        for c in [
            Control::Join { id: "ab12cd34".into(), observe: true, history: History::Now },
            Control::Join { id: "x".into(), observe: false, history: History::All },
            Control::List { host: false },
            Control::List { host: true },
            Control::Role(Role::Controller),
            Control::Role(Role::Observer),
        ] {
            assert_eq!(Control::parse(&c.encode()), Ok(Some(c.clone())), "{c:?}");
        }
        // A plain hello stays one.
        let h = Control::Hello { session: None, received: 0 };
        assert_eq!(Control::parse(&h.encode()), Ok(Some(h)));
        // Bad values are refused, never guessed.
        assert!(Control::parse(br#"!{"hello":1,"session":null,"received":0,"join":5}"#).is_err());
        assert!(Control::parse(br#"!{"hello":1,"session":null,"received":0,"join":"a","history":"some"}"#)
            .is_err());
        assert!(Control::parse(br#"!{"role":"king"}"#).is_err());
    }
}
