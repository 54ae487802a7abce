//! Fuzz the decoding of host-tool frames, as the host decodes the relay's output and the relay
//! decodes the host's and its clients': arbitrary bytes, fed in arbitrary pieces.
//!
//! Properties: nothing panics; the decoder never holds more than one bounded frame; a decoded
//! frame re-encodes to bytes that decode to the same frame; after an error every later piece
//! gets the same error (the channel is abandoned).
#![no_main]

use host_tools::frame::{Decoder, Frame, HEADER_BYTES};
use libfuzzer_sys::fuzz_target;

const BOUND: usize = 4096;

fuzz_target!(|input: (u8, Vec<u8>)| {
    let (piece, bytes) = input;
    let piece = usize::from(piece.max(1));
    let mut decoder = Decoder::new(BOUND);
    let mut failed = None;
    for chunk in bytes.chunks(piece) {
        match decoder.feed_all(chunk) {
            Ok(frames) => {
                assert!(failed.is_none(), "a failed decoder decoded again");
                for frame in frames {
                    let encoded = frame.encode();
                    assert!(encoded.len() <= HEADER_BYTES + BOUND);
                    let again: Vec<Frame> = Decoder::new(BOUND).feed_all(&encoded).unwrap();
                    assert_eq!(again, vec![frame]);
                }
            }
            Err(error) => {
                if let Some(first) = &failed {
                    assert_eq!(&error, first);
                }
                failed = Some(error);
            }
        }
    }
});
