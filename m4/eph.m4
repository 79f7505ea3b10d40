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
