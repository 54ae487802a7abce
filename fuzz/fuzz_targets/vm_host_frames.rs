//! Fuzz the guest agent's decoding of what the host sends: arbitrary bytes, first searched for
//! a session's `Hello`, then decoded as frames.
//!
//! Properties: nothing panics; a decoded message re-encodes to the same frame length it was
//! decoded from (encoding is canonical); an exec request never has an empty argv; the
//! decoder's buffer stays bounded.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vm_agent::proto::{encode, hello_prefix, FrameDecoder, HostMsg, HEADER_LEN, MAX_PAYLOAD};

fuzz_target!(|bytes: Vec<u8>| {
    let prefix = hello_prefix();
    let mut decoder = FrameDecoder::<HostMsg>::new();
    decoder.push(&bytes);
    if !decoder.skip_to(&prefix) {
        assert!(decoder.buffered() < prefix.len());
        return;
    }
    loop {
        let before = decoder.buffered();
        match decoder.next_message() {
            Ok(Some((id, message))) => {
                if let HostMsg::Exec(request) = &message {
                    assert!(!request.argv.is_empty());
                }
                assert_eq!(before - decoder.buffered(), encode(id, &message).len());
            }
            Ok(None) => {
                assert!(decoder.buffered() <= HEADER_LEN + MAX_PAYLOAD + bytes.len());
                return;
            }
            Err(_) => return,
        }
    }
});
