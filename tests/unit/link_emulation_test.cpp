// unit/link_emulation_test.cpp: --emulate-link values (comet/link_emulation.h): parsing,
// validation with messages naming the bad value, descriptions.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "comet/link_emulation.h"
#include "support/test_support.h"

namespace comet {
namespace {

using test::throws_with;

TEST(LinkEmulation, ParsesRateAndOptionalLatency) {
  const LinkEmulation a = parse_link_emulation("450");
  EXPECT_DOUBLE_EQ(a.gbps, 450);
  EXPECT_DOUBLE_EQ(a.latency_us, 0);
  EXPECT_TRUE(a.on());
  const LinkEmulation b = parse_link_emulation("160,2.5");
  EXPECT_DOUBLE_EQ(b.gbps, 160);
  EXPECT_DOUBLE_EQ(b.latency_us, 2.5);
  const LinkEmulation c = parse_link_emulation("0.5,0");
  EXPECT_DOUBLE_EQ(c.gbps, 0.5);
  EXPECT_DOUBLE_EQ(c.latency_us, 0);
  EXPECT_TRUE(c.validate().ok);
}

TEST(LinkEmulation, RejectsBadValuesNamingThem) {
  EXPECT_TRUE(throws_with<Error>([] { parse_link_emulation("0"); }, {"positive", "got 0"}));
  EXPECT_TRUE(throws_with<Error>([] { parse_link_emulation("-450"); }, {"positive", "-450"}));
  EXPECT_TRUE(throws_with<Error>([] { parse_link_emulation("450,-1"); }, {"latency", "-1"}));
  EXPECT_TRUE(throws_with<Error>([] { parse_link_emulation("fast"); }, {"rate", "\"fast\"", "not a number"}));
  EXPECT_TRUE(throws_with<Error>([] { parse_link_emulation("450,"); }, {"latency", "not a number"}));
  EXPECT_TRUE(throws_with<Error>([] { parse_link_emulation(""); }, {"rate", "not a number"}));
  EXPECT_TRUE(throws_with<Error>([] { parse_link_emulation("450,2,3"); }, {"latency", "\"2,3\""}));
  EXPECT_TRUE(throws_with<Error>([] { parse_link_emulation("450us"); }, {"\"450us\""}));
  EXPECT_TRUE(throws_with<Error>([] { parse_link_emulation("inf"); }, {"not a number"}));
  EXPECT_TRUE(throws_with<Error>([] { parse_link_emulation("nan,1"); }, {"not a number"}));
  EXPECT_TRUE(throws_with<Error>([] { parse_link_emulation("450,2e6"); }, {"latency", "2e+06"}));
}

TEST(LinkEmulation, ValidateAcceptsOffAndRejectsWhatCannotRun) {
  EXPECT_TRUE(LinkEmulation{}.validate().ok);  // off
  EXPECT_FALSE(LinkEmulation{}.on());
  EXPECT_TRUE((LinkEmulation{450, 2}).validate().ok);
  const Status negative = LinkEmulation{-1, 0}.validate();
  EXPECT_FALSE(negative.ok);
  EXPECT_TRUE(test::contains(negative.reason, "got -1"));
  const Status nan_rate = LinkEmulation{std::nan(""), 0}.validate();
  EXPECT_FALSE(nan_rate.ok);
  EXPECT_TRUE(test::contains(nan_rate.reason, "rate"));
  const Status inf_latency = LinkEmulation{450, std::numeric_limits<double>::infinity()}.validate();
  EXPECT_FALSE(inf_latency.ok);
  EXPECT_TRUE(test::contains(inf_latency.reason, "latency"));
  const Status crawl = LinkEmulation{1e-15, 0}.validate();
  EXPECT_FALSE(crawl.ok);
  EXPECT_TRUE(test::contains(crawl.reason, "at least"));
  const Status latency_only = LinkEmulation{0, 2}.validate();  // a latency needs a rate
  EXPECT_FALSE(latency_only.ok);
  EXPECT_TRUE(test::contains(latency_only.reason, "2 us"));
}

TEST(LinkEmulation, Describes) {
  EXPECT_EQ((LinkEmulation{450, 2}).describe(), "emulated link 450 GB/s, 2 us");
  EXPECT_EQ((LinkEmulation{160, 0.5}).describe(), "emulated link 160 GB/s, 0.5 us");
  EXPECT_EQ(LinkEmulation{}.describe(), "no link emulation");
  EXPECT_EQ((LinkEmulation{450, 2}).short_name(), "450GB/s,2us");
  EXPECT_EQ(LinkEmulation{}.short_name(), "off");
}

}  // namespace
}  // namespace comet
