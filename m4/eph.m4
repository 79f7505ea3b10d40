# EPH_DEP(VAR, MODULES, DEBIAN-PACKAGES)
# pkg-config check whose failure names the Debian package(s) to install.
AC_DEFUN([EPH_DEP], [
  PKG_CHECK_MODULES([$1], [$2], [],
    [AC_MSG_ERROR([$2 not found: install the Debian package(s) $3])])
])

# EPH_PLUGIN(NAME): --enable-NAME / --disable-NAME (default enabled) and an
# automake conditional PLUGIN_<NAME with _ for ->.
AC_DEFUN([EPH_PLUGIN], [
  m4_pushdef([eph_var], m4_translit([$1], [-], [_]))
  m4_pushdef([eph_cond], m4_toupper(m4_translit([$1], [-], [_])))
  AC_ARG_ENABLE([$1],
    [AS_HELP_STRING([--disable-$1], [do not build the $1 plugin])],
    [], [enable_[]eph_var=yes])
  AM_CONDITIONAL([PLUGIN_]eph_cond, [test "x$enable_[]eph_var" != xno])
  AS_IF([test "x$enable_[]eph_var" != xno], [eph_plugins="$eph_plugins $1"])
  m4_popdef([eph_cond])
  m4_popdef([eph_var])
])

# EPH_SONAME(DEFINE, LIBNAME, LIBS): defines DEFINE (config.h) to the soname of LIBNAME
# (e.g. libcurl) that linking with LIBS records in DT_NEEDED, read back from a test program
# with readelf. A library bound on first use (sdk/support/lazylib.h) dlopen()s this name,
# so a distribution that bumps the soname changes it here instead of failing at run time.
AC_DEFUN([EPH_SONAME], [
  AC_REQUIRE([EPH_PROG_READELF])
  AC_MSG_CHECKING([the soname of $2])
  eph_save_LIBS=$LIBS
  LIBS="-Wl,--no-as-needed $3 $LIBS"
  eph_soname=
  AC_LINK_IFELSE([AC_LANG_PROGRAM([], [])],
    [eph_soname=`$READELF -d conftest$EXEEXT | sed -n 's/.*(NEEDED).*\@<:@\($2\.so@<:@^@:>@@:>@*\)\@:>@.*/\1/p' | head -n 1`])
  LIBS=$eph_save_LIBS
  AS_IF([test -z "$eph_soname"],
    [AC_MSG_ERROR([cannot find the soname of $2 (linking with $3): is its -dev package installed?])])
  AC_MSG_RESULT([$eph_soname])
  AC_DEFINE_UNQUOTED([$1], ["$eph_soname"], [soname of $2, bound on first use (sdk/support/lazylib.h)])
])

AC_DEFUN([EPH_PROG_READELF], [
  AC_CHECK_TOOL([READELF], [readelf])
  AS_IF([test -z "$READELF"], [AC_MSG_ERROR([readelf not found: install the Debian package binutils])])
])
