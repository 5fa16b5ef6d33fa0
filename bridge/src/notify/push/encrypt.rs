//! A notice encrypted to a subscription's key (RFC 8291 `aes128gcm`): ECDH
//! with a fresh key, HKDF, one AES-128-GCM record. Separate because it is the
//! end-to-end part: only the browser holding the subscription's private key
//! reads what this makes, and it touches nothing but bytes.

use ring::{
    aead, agreement, hkdf,
    rand::{SecureRandom, SystemRandom},
};

use super::{subscription::decode_b64, PushError, Subscription, MAX_PAYLOAD};

/// Record size announced in the header: one record carries the whole notice
/// (push services take at most 4096 bytes of body).
const RECORD_SIZE: u32 = 4096;

/// `notice` encrypted to `sub` (RFC 8291): the body of the push request.
pub fn encrypt(sub: &Subscription, notice: &[u8]) -> Result<Vec<u8>, PushError> {
    if notice.len() > MAX_PAYLOAD {
        return Err(PushError::Subscription(format!("a notice of {} bytes is too long", notice.len())));
    }
    let rng = SystemRandom::new();
    let ua_public = decode_b64(&sub.p256dh).ok_or(PushError::Crypto)?;
    let auth = decode_b64(&sub.auth).ok_or(PushError::Crypto)?;
    let ours = agreement::EphemeralPrivateKey::generate(&agreement::ECDH_P256, &rng)
        .map_err(|_| PushError::Crypto)?;
    let as_public = ours.compute_public_key().map_err(|_| PushError::Crypto)?;
    let as_public = as_public.as_ref().to_vec();
    let theirs = agreement::UnparsedPublicKey::new(&agreement::ECDH_P256, &ua_public);
    let ecdh: Vec<u8> =
        agreement::agree_ephemeral(ours, &theirs, |secret| secret.to_vec()).map_err(|_| PushError::Crypto)?;
    // IKM = HKDF(salt = auth, ikm = ECDH, info = "WebPush: info\0" || ua_public || as_public, 32)
    let mut info = b"WebPush: info\0".to_vec();
    info.extend_from_slice(&ua_public);
    info.extend_from_slice(&as_public);
    let ikm = hkdf_sha256(&auth, &ecdh, &info, 32)?;
    let mut salt = [0u8; 16];
    rng.fill(&mut salt).map_err(|_| PushError::Crypto)?;
    let cek = hkdf_sha256(&salt, &ikm, b"Content-Encoding: aes128gcm\0", 16)?;
    let nonce = hkdf_sha256(&salt, &ikm, b"Content-Encoding: nonce\0", 12)?;
    // One record, the last: the notice, then the delimiter 0x02 (no padding).
    let mut record = notice.to_vec();
    record.push(2);
    let key = aead::LessSafeKey::new(
        aead::UnboundKey::new(&aead::AES_128_GCM, &cek).map_err(|_| PushError::Crypto)?,
    );
    let nonce = aead::Nonce::try_assume_unique_for_key(&nonce).map_err(|_| PushError::Crypto)?;
    key.seal_in_place_append_tag(nonce, aead::Aad::empty(), &mut record).map_err(|_| PushError::Crypto)?;
    let mut body = Vec::with_capacity(16 + 4 + 1 + as_public.len() + record.len());
    body.extend_from_slice(&salt);
    body.extend_from_slice(&RECORD_SIZE.to_be_bytes());
    body.push(as_public.len() as u8);
    body.extend_from_slice(&as_public);
    body.extend_from_slice(&record);
    Ok(body)
}

/// HKDF-SHA-256: extract with `salt`, expand `info` to `len` bytes.
fn hkdf_sha256(salt: &[u8], ikm: &[u8], info: &[u8], len: usize) -> Result<Vec<u8>, PushError> {
    struct Len(usize);
    impl hkdf::KeyType for Len {
        fn len(&self) -> usize {
            self.0
        }
    }
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, salt).extract(ikm);
    let info = [info];
    let okm = prk.expand(&info, Len(len)).map_err(|_| PushError::Crypto)?;
    let mut out = vec![0u8; len];
    okm.fill(&mut out).map_err(|_| PushError::Crypto)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::notify::push::test_support::sub;

    #[test]
    fn the_body_has_the_rfc8291_header_and_one_record() {
        let s = sub();
        let body = encrypt(&s, b"{\"hi\":1}").unwrap();
        assert_eq!(&body[16..20], &RECORD_SIZE.to_be_bytes());
        assert_eq!(body[20], 65, "keyid is our ephemeral public key");
        assert_eq!(body[21], 4, "an uncompressed point");
        assert_eq!(body.len(), 16 + 4 + 1 + 65 + 8 + 1 + 16);
        assert!(encrypt(&s, &vec![b'x'; MAX_PAYLOAD + 1]).is_err());
    }
}
