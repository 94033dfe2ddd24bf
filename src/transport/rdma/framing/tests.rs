//! The framing layer without hardware: messages of every size survive the trip through slots, and
//! every kind of damage a UC link can do — a flipped bit, a lost, repeated or reordered slot, a forged
//! length — is caught.

use super::*;

const SLOT: usize = 4096;

/// The slots a message becomes.
fn frame(framer: &mut Framer, message: &[u8]) -> Vec<Vec<u8>> {
    let mut slots = Vec::new();
    let mut offset = 0;
    loop {
        let mut slot = vec![0u8; SLOT];
        offset = framer.write_fragment(message, offset, &mut slot);
        slots.push(slot);
        if offset == message.len() {
            return slots;
        }
    }
}

fn deliver(reassembler: &mut Reassembler, slots: &[Vec<u8>]) -> Result<Vec<u8>, FramingError> {
    for (i, slot) in slots.iter().enumerate() {
        let complete = reassembler.accept(slot)?;
        assert_eq!(complete, i + 1 == slots.len(), "complete only at the last slot");
    }
    Ok(reassembler.message().to_vec())
}

#[test]
fn messages_of_every_size_arrive_whole_and_in_order() {
    let (mut framer, mut reassembler) = (Framer::default(), Reassembler::new(1 << 20));
    let payload = SLOT - HEADER_BYTES;
    for len in [0, 1, payload - 1, payload, payload + 1, 3 * payload, 100_000] {
        let message: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
        let slots = frame(&mut framer, &message);
        assert_eq!(slots.len(), slots_for(len, SLOT), "{len} bytes");
        assert_eq!(deliver(&mut reassembler, &slots).unwrap(), message, "{len} bytes");
    }
}

#[test]
fn a_flipped_bit_anywhere_is_caught() {
    let message = vec![0x5au8; 5000];
    for byte in [5, 13, 17, 21, 26, HEADER_BYTES, HEADER_BYTES + 1000] {
        let (mut framer, mut reassembler) = (Framer::default(), Reassembler::new(1 << 20));
        let mut slots = frame(&mut framer, &message);
        slots[0][byte] ^= 0x10;
        let err = deliver(&mut reassembler, &slots).unwrap_err();
        assert!(matches!(err, FramingError::Checksum { .. } | FramingError::Malformed { .. }), "byte {byte}: {err:?}");
    }
    let (mut framer, mut reassembler) = (Framer::default(), Reassembler::new(1 << 20));
    let mut slots = frame(&mut framer, &message);
    slots[0][0] ^= 1;
    assert!(matches!(deliver(&mut reassembler, &slots), Err(FramingError::BadMagic(_))));
    assert_eq!(reassembler.accept(&[0u8; 8]), Err(FramingError::Short(8)));
}

#[test]
fn lost_repeated_and_reordered_slots_are_caught() {
    let message = vec![1u8; 3 * SLOT];
    let (mut framer, mut reassembler) = (Framer::default(), Reassembler::new(1 << 20));
    let slots = frame(&mut framer, &message);
    assert_eq!(slots.len(), 4);
    // Lost: the second slot never arrives.
    reassembler.accept(&slots[0]).unwrap();
    assert_eq!(reassembler.accept(&slots[2]), Err(FramingError::Sequence { expected: 1, got: 2 }));

    // Repeated: the first slot twice.
    let mut reassembler = Reassembler::new(1 << 20);
    reassembler.accept(&slots[0]).unwrap();
    assert_eq!(reassembler.accept(&slots[0]), Err(FramingError::Sequence { expected: 1, got: 0 }));

    // A whole message lost: the next one's first slot is out of sequence.
    let next = frame(&mut framer, b"next");
    let mut reassembler = Reassembler::new(1 << 20);
    assert_eq!(reassembler.accept(&next[0]), Err(FramingError::Sequence { expected: 0, got: 4 }));
}

#[test]
fn forged_lengths_and_oversized_messages_are_refused() {
    let (mut framer, mut reassembler) = (Framer::default(), Reassembler::new(10_000));
    let slots = frame(&mut framer, &vec![0u8; 20_000]);
    assert_eq!(reassembler.accept(&slots[0]), Err(FramingError::TooLarge { len: 20_000, max: 10_000 }));

    // A fragment length beyond the slot, with a matching checksum.
    let (mut framer, mut reassembler) = (Framer::default(), Reassembler::new(1 << 20));
    let mut slot = frame(&mut framer, b"hello").remove(0);
    slot[20..24].copy_from_slice(&(SLOT as u32).to_le_bytes());
    assert!(matches!(reassembler.accept(&slot), Err(FramingError::Malformed { .. })));

    // A message that starts mid-way.
    let (mut framer, mut reassembler) = (Framer::default(), Reassembler::new(1 << 20));
    let slots = frame(&mut framer, &vec![2u8; 2 * SLOT]);
    let mut forged = slots[0].clone();
    forged[16..20].copy_from_slice(&8u32.to_le_bytes());
    let crc = checksum(&forged[..HEADER_BYTES], &forged[HEADER_BYTES..HEADER_BYTES + (SLOT - HEADER_BYTES)]);
    forged[24..28].copy_from_slice(&crc.to_le_bytes());
    assert!(matches!(reassembler.accept(&forged), Err(FramingError::Malformed { .. })));
}

#[test]
fn send_credits_hand_out_each_free_slot_once() {
    let mut credits = SendCredits::new(3);
    let taken: Vec<u32> = std::iter::from_fn(|| credits.take()).collect();
    assert_eq!(taken, [0, 1, 2]);
    assert_eq!(credits.take(), None, "no credit until a completion");
    credits.give_back(1).unwrap();
    assert_eq!(credits.give_back(1), Err(FramingError::SlotReturnedTwice(1)));
    assert_eq!(credits.give_back(7), Err(FramingError::SlotReturnedTwice(7)));
    assert_eq!(credits.available(), 1);
    assert_eq!(credits.take(), Some(1));
    for slot in 0..3 {
        credits.give_back(slot).unwrap();
    }
    assert!(credits.all_free());
}
