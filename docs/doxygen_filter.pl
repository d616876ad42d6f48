#!/usr/bin/perl
# Doxygen input filter (docs/Doxyfile): the public headers document with
# plain // comments. This makes them doc comments for the reference: the
# comment block a header opens with describes the file, a comment line
# before a declaration describes it, one after `;` or `,` describes that
# member. Characters Doxygen reads as commands or HTML are escaped, so the
# text comes out as written. The headers themselves stay as they are.
use strict;
use warnings;

sub text { my $t = shift; $t =~ s/([\\@#<>&%\$])/\\$1/g; return $t; }

my $head = 1;  # still in the comment block the file opens with
while (my $line = <>) {
  if ($line =~ m{^(\s*)//(?: (.*))?$}) {
    my ($indent, $t) = ($1, defined $2 ? $2 : "");
    print "/// \\file\n" if $head && $. == 1;
    print "$indent/// " . text($t) . "\n";
  } elsif ($line =~ m{^(.*?[;,])\s*// (.*)$}) {
    $head = 0;
    print "$1 ///< " . text($2) . "\n";
  } else {
    $head = 0;
    print $line;
  }
}
