-- Nobody unverified holds a staff role (issue 55): a stranger who signed up with the operator's
-- address first must never become staff. Any such account is put back to `user` (its sessions
-- end), then the rule is kept by the database itself.
UPDATE users SET role = 'user', session_epoch = session_epoch + 1
 WHERE role <> 'user' AND email_verified_at IS NULL;
ALTER TABLE users ADD CONSTRAINT users_staff_are_verified CHECK (role = 'user' OR email_verified_at IS NOT NULL);
