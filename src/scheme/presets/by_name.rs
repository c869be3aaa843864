//! A preset by its name, for configuration read from the environment.

use std::str::FromStr;

use crate::error::{ConfigError, ConfigErrorKind};
use crate::scheme::Scheme;

/// A preset by name — `standard` (or `svix`), `stripe`, `github`, `slack`, `shopify`,
/// `discord`, `sendgrid`, `paddle`, `zoom`, `meta`, `intercom`, `twitch`, `twilio`,
/// `twilio-sha256`, `square`, `hubspot`, `linear`, `mailgun`, `microsoft-graph` (or `graph`) — for
/// configuration read from the environment.
///
/// ```
/// use tower_webhook::Scheme;
/// let scheme: Scheme = "stripe".parse()?;
/// assert_eq!(scheme.name(), "stripe");
/// assert!("paypal".parse::<Scheme>().is_err());
/// # Ok::<(), tower_webhook::ConfigError>(())
/// ```
impl FromStr for Scheme {
    type Err = ConfigError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name.trim().to_ascii_lowercase().as_str() {
            "standard" | "standard-webhooks" | "svix" => Ok(Self::standard()),
            "stripe" => Ok(Self::stripe()),
            "github" => Ok(Self::github()),
            "slack" => Ok(Self::slack()),
            "shopify" => Ok(Self::shopify()),
            "discord" => Ok(Self::discord()),
            "sendgrid" => Ok(Self::sendgrid()),
            "paddle" => Ok(Self::paddle()),
            "zoom" => Ok(Self::zoom()),
            "meta" | "whatsapp" | "instagram" | "messenger" => Ok(Self::meta()),
            "intercom" => Ok(Self::intercom()),
            "twitch" => Ok(Self::twitch()),
            "twilio" => Ok(Self::twilio()),
            "twilio-sha256" => Ok(Self::twilio_sha256()),
            "square" => Ok(Self::square()),
            "hubspot" => Ok(Self::hubspot()),
            "linear" => Ok(Self::linear()),
            "mailgun" => Ok(Self::mailgun()),
            "graph" | "microsoft-graph" | "msgraph" => Ok(Self::microsoft_graph()),
            "sns" | "aws-sns" => Err(ConfigError::new(
                ConfigErrorKind::InvalidValue,
                "sns needs the topic ARNs it accepts: use Scheme::sns(topics)",
            )),
            "paypal" => Err(ConfigError::new(
                ConfigErrorKind::InvalidValue,
                "paypal needs its webhook id: use Scheme::paypal(webhook_id)",
            )),
            _ => Err(ConfigError::new(
                ConfigErrorKind::InvalidValue,
                format!(
                    "unknown scheme {name:?}: use standard, stripe, github, slack, shopify, \
                     discord, sendgrid, paddle, zoom, meta, intercom, twitch, twilio, \
                     twilio-sha256, square, hubspot, linear, mailgun or microsoft-graph"
                ),
            )),
        }
    }
}
