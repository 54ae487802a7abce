//! Property tests of the wire protocol: every message round-trips through any split of its
//! bytes, a truncated frame is never a message, arbitrary bytes never panic the decoder and
//! never grow its buffer past one frame.

use proptest::prelude::*;
use vm_agent::proto::{
    encode, Entry, ErrorCode, ExecRequest, ExitStatus, FileKind, FrameDecoder, GuestMsg, HostMsg,
    Message, ProtoError, Stat, HEADER_LEN, MAX_IDENTITY, MAX_PAYLOAD, MAX_RENEW_ENTROPY,
    MIN_RENEW_ENTROPY,
};

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..max)
}

fn host_msg() -> impl Strategy<Value = HostMsg> {
    prop_oneof![
        any::<[u8; 16]>().prop_map(|nonce| HostMsg::Hello { nonce }),
        (
            prop::collection::vec(bytes(40), 1..6),
            prop::collection::vec((bytes(20), bytes(20)), 0..4),
            bytes(30),
            any::<bool>(),
            any::<u64>(),
            any::<Option<(u32, u32)>>()
        )
            .prop_map(|(argv, env, workdir, stdin, timeout_ms, user)| {
                HostMsg::Exec(ExecRequest {
                    argv,
                    env,
                    workdir,
                    stdin,
                    timeout_ms,
                    user,
                })
            }),
        bytes(300).prop_map(HostMsg::Data),
        Just(HostMsg::Eof),
        any::<u32>().prop_map(HostMsg::Credit),
        Just(HostMsg::Kill),
        bytes(60).prop_map(|path| HostMsg::Stat { path }),
        (bytes(60), any::<u64>()).prop_map(|(path, limit)| HostMsg::Read { path, limit }),
        (bytes(60), any::<u32>()).prop_map(|(path, mode)| HostMsg::Write { path, mode }),
        bytes(60).prop_map(|path| HostMsg::List { path }),
        (bytes(60), any::<bool>())
            .prop_map(|(path, recursive)| HostMsg::Remove { path, recursive }),
        Just(HostMsg::Reclaim),
        Just(HostMsg::Shutdown),
        (
            proptest::collection::vec(any::<u8>(), MIN_RENEW_ENTROPY..=MAX_RENEW_ENTROPY),
            any::<u64>(),
            proptest::collection::vec(
                proptest::sample::select(b"abcXYZ019-".to_vec()),
                1..=MAX_IDENTITY
            ),
        )
            .prop_map(|(entropy, unix_nanos, identity)| HostMsg::Renew {
                entropy,
                unix_nanos,
                identity
            }),
        (1u16..).prop_map(|port| HostMsg::Accept { port }),
    ]
}

fn kind() -> impl Strategy<Value = FileKind> {
    prop_oneof![
        Just(FileKind::File),
        Just(FileKind::Dir),
        Just(FileKind::Symlink),
        Just(FileKind::Other)
    ]
}

fn guest_msg() -> impl Strategy<Value = GuestMsg> {
    prop_oneof![
        any::<[u8; 16]>().prop_map(|nonce| GuestMsg::HelloAck { nonce }),
        any::<u32>().prop_map(|pid| GuestMsg::Started { pid }),
        bytes(300).prop_map(GuestMsg::Stdout),
        bytes(300).prop_map(GuestMsg::Stderr),
        (
            prop_oneof![
                any::<i32>().prop_map(|c| (Some(c), None)),
                any::<i32>().prop_map(|s| (None, Some(s))),
                Just((None, None))
            ],
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(
                |((code, signal), timed_out, killed)| GuestMsg::Exited(ExitStatus {
                    code,
                    signal,
                    timed_out,
                    killed
                })
            ),
        any::<u32>().prop_map(GuestMsg::Credit),
        (kind(), any::<u64>(), any::<u32>(), any::<i64>()).prop_map(|(kind, size, mode, mtime)| {
            GuestMsg::Stat(Stat {
                kind,
                size,
                mode,
                mtime,
            })
        }),
        bytes(300).prop_map(GuestMsg::Data),
        prop::collection::vec(
            (bytes(30), kind(), any::<u64>()).prop_map(|(name, kind, size)| Entry {
                name,
                kind,
                size
            }),
            0..5
        )
        .prop_map(GuestMsg::Entries),
        (any::<u64>(), any::<u64>()).prop_map(|(before_kib, after_kib)| GuestMsg::Reclaimed {
            before_kib,
            after_kib
        }),
        Just(GuestMsg::Done),
        Just(GuestMsg::Connected),
        Just(GuestMsg::Eof),
        "[a-z ]{0,40}".prop_map(|message| GuestMsg::Error {
            code: ErrorCode::NotFound,
            message
        }),
    ]
}

/// Feeds `stream` in pieces of `piece` bytes and returns every message decoded.
fn decode_all<M: Message>(stream: &[u8], piece: usize) -> Result<Vec<(u32, M)>, ProtoError> {
    let mut decoder = FrameDecoder::<M>::new();
    let mut out = Vec::new();
    for chunk in stream.chunks(piece.max(1)) {
        decoder.push(chunk);
        while let Some(message) = decoder.next_message()? {
            out.push(message);
        }
    }
    assert_eq!(decoder.buffered(), 0, "whole frames leave nothing behind");
    Ok(out)
}

proptest! {
    #[test]
    fn host_messages_round_trip_through_any_split(
        messages in prop::collection::vec((any::<u32>(), host_msg()), 1..8),
        piece in 1usize..64,
    ) {
        let stream: Vec<u8> = messages.iter().flat_map(|(id, m)| encode(*id, m)).collect();
        prop_assert_eq!(decode_all::<HostMsg>(&stream, piece).unwrap(), messages);
    }

    #[test]
    fn guest_messages_round_trip_through_any_split(
        messages in prop::collection::vec((any::<u32>(), guest_msg()), 1..8),
        piece in 1usize..64,
    ) {
        let stream: Vec<u8> = messages.iter().flat_map(|(id, m)| encode(*id, m)).collect();
        prop_assert_eq!(decode_all::<GuestMsg>(&stream, piece).unwrap(), messages);
    }

    #[test]
    fn a_truncated_frame_is_never_a_message(message in guest_msg(), cut in any::<prop::sample::Index>()) {
        let frame = encode(5, &message);
        let cut = cut.index(frame.len());
        let mut decoder = FrameDecoder::<GuestMsg>::new();
        decoder.push(&frame[..cut]);
        prop_assert_eq!(decoder.next_message(), Ok(None));
    }

    #[test]
    fn a_payload_with_a_byte_more_or_less_is_refused(message in host_msg(), extra in any::<u8>()) {
        let mut frame = encode(1, &message);
        // One trailing byte inside the payload: the length grows by one.
        frame.push(extra);
        let len = (frame.len() - HEADER_LEN) as u32;
        frame[0..4].copy_from_slice(&len.to_be_bytes());
        let mut decoder = FrameDecoder::<HostMsg>::new();
        decoder.push(&frame);
        let refused = matches!(decoder.next_message(), Err(ProtoError::Trailing { .. }));
        prop_assert!(refused);
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_stay_bounded(
        stream in prop::collection::vec(any::<u8>(), 0..4096),
        piece in 1usize..512,
    ) {
        let mut decoder = FrameDecoder::<GuestMsg>::new();
        for chunk in stream.chunks(piece) {
            decoder.push(chunk);
            match decoder.next_message() {
                Ok(_) => prop_assert!(decoder.buffered() <= HEADER_LEN + MAX_PAYLOAD + piece),
                Err(_) => break,
            }
        }
    }
}

#[test]
fn a_wrong_version_or_kind_is_refused() {
    let mut frame = encode(1, &HostMsg::Kill);
    frame[4] = 9;
    let mut decoder = FrameDecoder::<HostMsg>::new();
    decoder.push(&frame);
    assert_eq!(
        decoder.next_message(),
        Err(ProtoError::Version { found: 9 })
    );
    let mut frame = encode(1, &HostMsg::Kill);
    frame[5] = 200;
    let mut decoder = FrameDecoder::<HostMsg>::new();
    decoder.push(&frame);
    assert_eq!(
        decoder.next_message(),
        Err(ProtoError::UnknownKind { kind: 200 })
    );
    // An exec with an empty argv and a list whose count exceeds its payload.
    let mut decoder = FrameDecoder::<HostMsg>::new();
    decoder.push(&[0, 0, 0, 4, 1, 2, 0, 0, 0, 1, 0, 0, 0, 0]);
    assert!(matches!(
        decoder.next_message(),
        Err(ProtoError::Invalid { field: "argv", .. })
    ));
    let mut decoder = FrameDecoder::<GuestMsg>::new();
    decoder.push(&[0, 0, 0, 4, 1, 72, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff]);
    assert!(matches!(
        decoder.next_message(),
        Err(ProtoError::Invalid {
            field: "item count",
            ..
        })
    ));
}
