//! Accounts and sessions: the sign-up grant, the sign-up and log-in throttles, the session
//! cookie and how long a process trusts what it knows of a token (turned into `SignupLimits`
//! and `LoginLimits`).

use std::time::Duration;

use clap::Args;

use engine::accounts::login::LoginLimits;
use engine::accounts::signup::SignupLimits;

#[derive(Clone, Debug, Args)]
#[command(next_help_heading = "Accounts, sessions and throttles")]
pub struct AccountArgs {
    /// Credits a new account starts with.
    #[arg(long, env = "SLUICE_SIGNUP_GRANT", default_value_t = 20, global = true)]
    pub signup_grant: i64,
    /// Failed logins per account within 15 minutes before 429.
    #[arg(long, env = "SLUICE_LOGIN_FAILURES_PER_ACCOUNT", default_value_t = 5, global = true)]
    pub login_failures_per_account: i64,
    /// Failed logins per client address within 15 minutes before 429.
    #[arg(long, env = "SLUICE_LOGIN_FAILURES_PER_ADDRESS", default_value_t = 20, global = true)]
    pub login_failures_per_address: i64,
    /// Accounts one client address may make per hour.
    #[arg(long, env = "SLUICE_SIGNUPS_PER_ADDRESS", default_value_t = 10, global = true)]
    pub signups_per_address: i64,
    /// Accounts one network (an IPv4 /24, an IPv6 /48) may make per hour.
    #[arg(long, env = "SLUICE_SIGNUPS_PER_NETWORK", default_value_t = 30, global = true)]
    pub signups_per_network: i64,
    /// Accounts that may be made per hour in all.
    #[arg(long, env = "SLUICE_SIGNUPS_PER_HOUR", default_value_t = 300, global = true)]
    pub signups_per_hour: i64,
    /// Mark the session cookie `Secure` (serve over HTTPS when you set this).
    #[arg(long, env = "SLUICE_SECURE_COOKIES", default_value_t = false, global = true)]
    pub secure_cookies: bool,
    /// Seconds a process keeps who a token or a session belongs to, so polls need not ask
    /// Postgres (0 to 5; 0 asks every time). Revoking a token, logging out and deleting an
    /// account reach every process at once through LISTEN/NOTIFY; this is the backstop.
    #[arg(long, env = "SLUICE_AUTH_CACHE_SECS", default_value_t = 5.0, global = true)]
    pub auth_cache_secs: f64,
}

impl AccountArgs {
    /// When failed log-ins are answered 429.
    pub fn login_limits(&self) -> LoginLimits {
        LoginLimits {
            per_account: self.login_failures_per_account,
            per_address: self.login_failures_per_address,
            ..Default::default()
        }
    }

    /// How many accounts an address, a network and everyone may make in an hour.
    pub fn signup_limits(&self) -> SignupLimits {
        SignupLimits {
            per_address: self.signups_per_address,
            per_network: self.signups_per_network,
            overall: self.signups_per_hour,
            ..SignupLimits::default()
        }
    }

    /// How long a process keeps who a token or a session belongs to (0 to 5 s).
    pub fn auth_cache_lifetime(&self) -> Duration {
        Duration::from_secs_f64(if self.auth_cache_secs.is_finite() {
            self.auth_cache_secs.clamp(0.0, 5.0)
        } else {
            5.0
        })
    }
}
