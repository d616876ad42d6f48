#!/usr/bin/perl
# Doxygen input filter for docs/api_mainpage.md (docs/Doxyfile,
# FILTER_PATTERNS): a line `@README_USE_IT_<k>@` becomes the k-th fenced code
# block (k = 1, 2, ...) of the "## Use it" section of README.md, fences
# included, so the front page of the reference shows the README's code
# as it is now and there is one copy to keep up to date. A marker with no
# such block stays as it is: Doxygen reports an unknown command there, and
# the run fails (WARN_AS_ERROR).
use strict;
use warnings;
use File::Basename qw(dirname);
use File::Spec;

my $page = $ARGV[0] // die "usage: mainpage_filter.pl docs/api_mainpage.md\n";
my $readme = File::Spec->catfile(dirname(File::Spec->rel2abs($page)), File::Spec->updir, "README.md");

my @blocks;
if (open(my $r, "<", $readme)) {
  my ($in_section, $in_block) = (0, 0);
  my $cur;
  while (my $line = <$r>) {
    if (!$in_block && $line =~ /^##\s/) {
      $in_section = $line =~ /^##\s+Use it\s*$/ ? 1 : 0;
      next;
    }
    next unless $in_section;
    if (!$in_block && $line =~ /^```/) { $in_block = 1; $cur = $line; next; }
    if ($in_block) {
      $cur .= $line;
      if ($line =~ /^```\s*$/) { push @blocks, $cur; $in_block = 0; }
    }
  }
  close $r;
} else {
  print STDERR "mainpage_filter.pl: cannot read $readme: $!\n";
}

open(my $p, "<", $page) or die "mainpage_filter.pl: cannot read $page: $!\n";
while (my $line = <$p>) {
  if ($line =~ /^\@README_USE_IT_(\d+)\@\s*$/ && $1 >= 1 && $1 <= @blocks) {
    print $blocks[$1 - 1];
  } else {
    print STDERR "mainpage_filter.pl: README.md's \"Use it\" has no code block $1\n"
      if $line =~ /^\@README_USE_IT_(\d+)\@\s*$/;
    print $line;
  }
}
