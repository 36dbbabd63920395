//! Who may do what in the console. Pure: the server checks a caller's role against a
//! [`Permission`] before every console function, and the console shows only what the role may do.
//!
//! Three staff roles, after the anchors' consoles (Oban Web, Sidekiq Enterprise, Hatchet), which
//! keep looking apart from acting, and acting on jobs apart from money and access:
//! - `support` looks (search, job pages, the audit log) and may mark a failed job for review
//!   with a note;
//! - `operator` also acts on jobs (replay, discard, cancel, retry now, bulk actions, resolve
//!   reviews, acknowledge alerts, open documents) and pauses or resumes processing;
//! - `admin` also sets the gate, grants credits and manages users and their limits.

use serde::{Deserialize, Serialize};

/// An account's role.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "sqlx", derive(sqlx::Type), sqlx(type_name = "text", rename_all = "snake_case"))]
#[serde(rename_all = "snake_case")]
pub enum Role {
    User,
    Support,
    Operator,
    Admin,
}

/// Something only some roles may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Permission {
    /// Read the console: vital signs, dead letters, reviews, alerts, job search, any job's
    /// page, the audit log.
    SeeConsole,
    /// Mark a failed job "needs review" and add a note.
    MarkForReview,
    /// Replay, discard, cancel and retry others' jobs, run bulk actions, resolve reviews,
    /// acknowledge alerts and reconciliation reports.
    ActOnJobs,
    /// Open a user's document or result (audited).
    OpenDocuments,
    /// The kill switch: pause and resume processing.
    PauseProcessing,
    /// Set the global concurrency gate.
    SetGate,
    /// Grant or take back credits.
    GrantCredits,
    /// Set a user's in-flight limit and role.
    ManageUsers,
}

impl Permission {
    pub const ALL: [Permission; 8] = [
        Permission::SeeConsole,
        Permission::MarkForReview,
        Permission::ActOnJobs,
        Permission::OpenDocuments,
        Permission::PauseProcessing,
        Permission::SetGate,
        Permission::GrantCredits,
        Permission::ManageUsers,
    ];
}

impl Role {
    pub const ALL: [Role; 4] = [Role::User, Role::Support, Role::Operator, Role::Admin];

    /// The name stored in the database, taken by `server set-role` and shown by `list-users`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Support => "support",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }

    /// A role by its name (None for anything else).
    pub fn parse(name: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == name)
    }

    /// Whether this role may do `what`.
    pub fn may(self, what: Permission) -> bool {
        use Permission::*;
        match self {
            Role::Admin => true,
            Role::Operator => !matches!(what, SetGate | GrantCredits | ManageUsers),
            Role::Support => matches!(what, SeeConsole | MarkForReview),
            Role::User => false,
        }
    }

    /// Whether the console is open to this role at all.
    pub fn is_staff(self) -> bool {
        self.may(Permission::SeeConsole)
    }

    /// Everything this role may do, for the console to show only that.
    pub fn permissions(self) -> Vec<Permission> {
        Permission::ALL.into_iter().filter(|p| self.may(*p)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_role_may_do_what_the_one_below_it_may_and_more() {
        let order = [Role::User, Role::Support, Role::Operator, Role::Admin];
        for pair in order.windows(2) {
            let (lower, higher) = (pair[0].permissions(), pair[1].permissions());
            assert!(lower.iter().all(|p| higher.contains(p)), "{:?} < {:?}", pair[0], pair[1]);
            assert!(higher.len() > lower.len(), "{:?} adds something", pair[1]);
        }
        assert_eq!(Role::Admin.permissions(), Permission::ALL);
        assert!(Role::User.permissions().is_empty());
    }

    #[test]
    fn support_only_looks_and_marks_and_operators_never_touch_money_gate_or_users() {
        assert_eq!(Role::Support.permissions(), [Permission::SeeConsole, Permission::MarkForReview]);
        for p in [Permission::SetGate, Permission::GrantCredits, Permission::ManageUsers] {
            assert!(!Role::Operator.may(p), "{p:?}");
        }
        for p in [Permission::ActOnJobs, Permission::PauseProcessing, Permission::OpenDocuments] {
            assert!(Role::Operator.may(p) && !Role::Support.may(p), "{p:?}");
        }
    }

    #[test]
    fn names_read_back_and_nothing_else_is_a_role() {
        for role in Role::ALL {
            assert_eq!(Role::parse(role.as_str()), Some(role));
            assert_eq!(serde_json::to_string(&role).unwrap(), format!("\"{}\"", role.as_str()));
        }
        for junk in ["", "Admin", "root", "admin ", "superuser"] {
            assert_eq!(Role::parse(junk), None, "{junk:?}");
        }
    }
}
