//! Raw content-header properties: `RawProperties::new` must refuse or accept
//! without panicking, and whatever it accepts must decode, agree with the full
//! decode on the fields it indexes, and re-encode stably.

#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use sluice_wire::content::RawProperties;

fuzz_target!(|data: &[u8]| {
    let Ok(raw) = RawProperties::new(Bytes::copy_from_slice(data)) else {
        return;
    };
    let decoded = raw.decode().expect("accepted properties must decode");
    assert_eq!(raw.delivery_mode(), *decoded.delivery_mode());
    assert_eq!(raw.priority(), *decoded.priority());
    assert_eq!(
        raw.expiration().map(|expiration| expiration.to_vec()),
        decoded
            .expiration()
            .as_ref()
            .map(|expiration| expiration.as_str().as_bytes().to_vec())
    );
    assert_eq!(raw.has_headers(), decoded.headers().is_some());
    // Re-encoding is stable. (Compared as bytes: a NaN in the headers makes
    // the decoded values unequal to themselves.)
    let again = RawProperties::from_properties(&decoded);
    let twice =
        RawProperties::from_properties(&again.decode().expect("re-encoded properties must decode"));
    assert_eq!(again.as_bytes(), twice.as_bytes());
});
