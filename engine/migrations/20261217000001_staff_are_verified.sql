-- Nobody unverified holds a staff role (issue 55): a stranger who signed up with the operator's
-- address first must never become staff. Any such account is put back to `user` (its sessions,
-- device tokens and API tokens end), then the rule is kept by the database itself.
WITH demoted AS (
    UPDATE users SET role = 'user', session_epoch = session_epoch + 1
    WHERE role <> 'user' AND email_verified_at IS NULL
    RETURNING id),
devices AS (DELETE FROM device_tokens WHERE user_id IN (SELECT id FROM demoted))
UPDATE api_tokens SET revoked_at = now() WHERE revoked_at IS NULL AND user_id IN (SELECT id FROM demoted);
ALTER TABLE users ADD CONSTRAINT users_staff_are_verified CHECK (role = 'user' OR email_verified_at IS NOT NULL);
