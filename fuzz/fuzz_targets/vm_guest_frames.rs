//! Fuzz the host's decoding of what a guest agent sends: arbitrary bytes, fed in arbitrary
//! pieces, first through the handshake search and then through the frame decoder.
//!
//! Properties: nothing panics; the decoder never buffers more than one bounded frame plus the
//! last piece; a decoded message re-encodes to exactly the bytes it was decoded from; after an
//! error the input is abandoned (as the client closes the channel).
#![no_main]

use libfuzzer_sys::fuzz_target;
use vm_agent::proto::{encode, hello_ack_bytes, FrameDecoder, GuestMsg, HEADER_LEN, MAX_PAYLOAD};

fuzz_target!(|input: (u8, Vec<u8>)| {
    let (piece, bytes) = input;
    let piece = usize::from(piece.max(1));
    let ack = hello_ack_bytes([9; 16]);
    let mut decoder = FrameDecoder::<GuestMsg>::new();
    let mut found = false;
    for chunk in bytes.chunks(piece) {
        decoder.push(chunk);
        if !found {
            found = decoder.skip_to(&ack);
            assert!(found || decoder.buffered() < ack.len());
            if !found {
                continue;
            }
        }
        loop {
            let before = decoder.buffered();
            match decoder.next_message() {
                Ok(Some((id, message))) => {
                    let frame = encode(id, &message);
                    assert!(frame.len() <= before);
                    assert_eq!(before - decoder.buffered(), frame.len());
                }
                Ok(None) => {
                    assert!(decoder.buffered() <= HEADER_LEN + MAX_PAYLOAD + piece);
                    break;
                }
                Err(_) => return,
            }
        }
    }
});
