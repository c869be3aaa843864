use super::{signing, verifying, Algorithm};
use crate::scheme::Scheme;

fn wiped_on_drop<T: zeroize::ZeroizeOnDrop>() {}

#[test]
fn hash_states_behind_hmac_keys_are_wiped_on_drop() {
    // Compiles only while sha1 and sha2 are built with their `zeroize` feature: the
    // keyed HMAC states are two of these hash cores each.
    use sha2::digest::block_api::CoreProxy;
    wiped_on_drop::<<sha2::Sha256 as CoreProxy>::Core>();
    wiped_on_drop::<<sha2::Sha512 as CoreProxy>::Core>();
    wiped_on_drop::<<sha1::Sha1 as CoreProxy>::Core>();
    wiped_on_drop::<ed25519_dalek::SigningKey>();
}

#[test]
fn public_keys_in_each_providers_format() {
    let standard = Scheme::standard();
    let pk = "whpk_1SiA4o9hyqTCpIqC5V9HUakiiaeACeqfZTInDBbOir4=";
    assert_eq!(
        verifying(&standard, pk, 0).unwrap().algorithm(),
        Algorithm::Ed25519
    );
    let sk = "whsk_6Xb/dCcHpPea21PS1N9VY/NZW723CEc77N4rJCubMbfVKIDij2HKpMKkioLlX0dRqSKJp4AJ6p9lMicMFs6Kvg==";
    // A signing key given to a receiver: refused, and the message says what to give.
    let err = verifying(&standard, sk, 3).unwrap_err();
    assert!(err.to_string().contains("secret #3"), "{err}");
    assert!(!err.to_string().contains("whsk_6Xb"), "{err}");
    assert!(signing(&standard, sk, 0).is_ok());
    // The public key without its prefix would become a shared secret anyone could
    // sign with: refused, as is a `whpk_` key where only secrets go.
    let bare = pk.trim_start_matches("whpk_");
    assert!(verifying(&standard, bare, 0).is_err());
    assert!(verifying(&Scheme::github(), pk, 0).is_err());
    // The same public key in hex (64 hex digits are valid base64 of 48 bytes): refused
    // too, with a message that names the two prefixes and not the key.
    let hex_bare = "d52880e28f61caa4c2a48a82e55f4751a92289a78009ea9f6532270c16ce8abe";
    assert!(
        verifying(&Scheme::discord(), hex_bare, 0).is_ok(),
        "the same key"
    );
    let err = verifying(&standard, hex_bare, 1).unwrap_err();
    assert!(err.to_string().contains("whpk_"), "{err}");
    assert!(!err.to_string().contains(&hex_bare[..16]), "{err}");
    assert!(verifying(&standard, &hex_bare.to_uppercase(), 0).is_err());
    // A bare 24-byte secret (Svix's length) is still a secret.
    assert!(verifying(&standard, "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", 0).is_ok());
    // Discord: hex; SendGrid: base64 DER.
    let discord = Scheme::discord();
    let hex_pk = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";
    assert!(verifying(&discord, hex_pk, 0).is_ok());
    assert!(verifying(&discord, &hex_pk[2..], 0).is_err());
    // The identity point has small order: refused.
    let weak = format!("01{}", "00".repeat(31));
    assert!(verifying(&discord, &weak, 0).is_err());
    let sendgrid = Scheme::sendgrid();
    let spki = "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE83T4O/n84iotIvIW4mdBgQ/7dAfSmpqIM8kF9mN1flpVKS3GRqe62gw+2fNNRaINXvVpiglSI8eNEc6wEA3F+g==";
    assert_eq!(
        verifying(&sendgrid, spki, 0).unwrap().algorithm(),
        Algorithm::EcdsaP256
    );
    assert!(verifying(&sendgrid, "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE", 0).is_err());
}

#[test]
fn an_ed25519_keypair_whose_halves_disagree_is_refused() {
    let seed = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
    let wrong_public = "00".repeat(32);
    assert!(signing(&Scheme::discord(), seed, 0).is_ok());
    assert!(signing(&Scheme::discord(), &format!("{seed}{wrong_public}"), 0).is_err());
}
