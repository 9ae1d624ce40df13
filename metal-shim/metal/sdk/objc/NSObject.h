/*
 * Checking stand-in for Apple's <objc/NSObject.h>, written for metal-shim's
 * Linux syntax check (metal-shim/metal/check.ts). It declares, in this
 * project's own words, only what metal-shim/metal/*.m uses; the names, types
 * and selectors follow Apple's public SDK headers (MacOSX SDK, objc and
 * Foundation). On a Mac the real SDK is used and this folder is never seen.
 */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* arm64 Apple platforms define BOOL as C99 bool. */
typedef bool BOOL;
#define YES __objc_yes
#define NO __objc_no
#define nil ((void *)0)
#define Nil ((void *)0)

typedef long NSInteger;
typedef unsigned long NSUInteger;
#define NSIntegerMax __LONG_MAX__
#define NSUIntegerMax (__LONG_MAX__ * 2UL + 1UL)

typedef struct _NSZone NSZone;

/* The SDK generation, as Apple's <Availability.h> gives it: __MAC_OS_X_VERSION_MAX_ALLOWED
 * is the newest macOS the SDK knows (140000: macOS 14 SDK, Xcode 15; 150000: macOS 15 SDK,
 * Xcode 16). check.ts compiles against both: -DCK_SDK_VERSION=140000 leaves out every
 * declaration that first appeared in the macOS 15 SDK, as the real macOS 14 SDK does. */
#ifndef CK_SDK_VERSION
#define CK_SDK_VERSION 150000
#endif
#define __MAC_14_0 140000
#define __MAC_15_0 150000
#define __MAC_OS_X_VERSION_MAX_ALLOWED CK_SDK_VERSION

/* Availability, as the SDK's API_AVAILABLE(macos(x)) expands on macOS. */
#define CK_SDK_MACOS(v) __attribute__((availability(macos, introduced = v)))
#define CK_SDK_MACOS_DEPRECATED(from, to) __attribute__((availability(macos, introduced = from, deprecated = to)))

#define NS_ASSUME_NONNULL_BEGIN _Pragma("clang assume_nonnull begin")
#define NS_ASSUME_NONNULL_END _Pragma("clang assume_nonnull end")
#define NS_RETURNS_RETAINED __attribute__((ns_returns_retained))
#define NS_FORMAT_FUNCTION(F, A) __attribute__((format(__NSString__, F, A)))
#define NS_ENUM(_type, _name) enum _name : _type _name; enum _name : _type
#define NS_OPTIONS(_type, _name) enum _name : _type _name; enum _name : _type
#define FOUNDATION_EXPORT extern
#define NS_REQUIRES_SUPER __attribute__((objc_requires_super))
#define NS_RETURNS_INNER_POINTER __attribute__((objc_returns_inner_pointer))
#define NS_NOESCAPE __attribute__((noescape))

NS_ASSUME_NONNULL_BEGIN

@class NSString;
@class NSMethodSignature;

/* The root protocol every object answers. */
@protocol NSObject
- (BOOL)isEqual:(nullable id)object;
@property (readonly) NSUInteger hash;
@property (readonly) Class superclass;
- (Class)class;
- (instancetype)self;
- (BOOL)isKindOfClass:(Class)aClass;
- (BOOL)conformsToProtocol:(Protocol *)aProtocol;
- (BOOL)respondsToSelector:(SEL)aSelector;
@property (readonly, copy) NSString *description;
@end

/* The root class. */
__attribute__((objc_root_class))
@interface NSObject <NSObject> {
  Class isa;
}
+ (instancetype)alloc;
+ (instancetype)new;
- (instancetype)init;
- (void)dealloc;
- (id)copy;
- (id)mutableCopy;
+ (Class)class;
@end

NS_ASSUME_NONNULL_END
